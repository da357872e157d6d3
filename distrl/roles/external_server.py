"""The simulator server's job without its process: a TCP server on its own thread and event loop, the
policy it acts with, and the fragments it assembles, taken by whoever hosts it (`take`).

To the driver it is a rollout worker: `take` returns a fragment (or, after a wait, none: an empty one
carrying only counts), its fragments go into the run's replay or trajectory queue, and while the driver
holds workers back (the rate limiter, a full queue) the server stops reading its clients once
`MAX_READY` fragments wait, so simulators block in their next call (TCP's own backpressure).

Remote inference: the `get_action`s that arrive together run as one batch through the policy's network
(`Policy.forward`), then each client's exploration slot picks its action (its acting rule, RNG and
schedule, as worker `slot` of `external.max_clients` would). Local inference: clients pull the newest
weights as an ONNX file (exported on a thread of its own, at most every `EXPORT_INTERVAL_S`) with their
slot's acting rule, and send their steps back in batches.

A recurrent policy acts in both: each step records the state its action was taken from (the server's, kept
per open episode; or the client's, sent with the step), and its episodes go into fragment columns of their
own, cut every fragment's length into columns that store their start states (`external_lanes.Lanes`).
"""
from __future__ import annotations

import asyncio
import base64
import heapq
import itertools
import threading
import time
from typing import Callable

import numpy as np

from distrl import tree
from distrl.client.spaces import protocol_for
from distrl.client.wire import ProtocolError
from distrl.core import Fragment, FragmentInfo
from distrl.envs.spaces import space_to_data
from distrl.roles.external_checks import Checks
from distrl.roles.external_lanes import Lanes
from distrl.roles.external_session import MAX_OPEN_EPISODES, Session
from distrl.roles.external_steps import Assembler
from distrl.roles.factory import make_algorithm, policy_seed

MAX_READY = 2  # fragments waiting for the driver before clients are held back
EXPORT_INTERVAL_S = 0.5  # local inference: newest weights exported at most this often
POLL_S = 0.02  # how often the newest weights are looked for
SLOT_SEED = 20_000  # client slot i explores with the seed of worker SLOT_SEED + i
COUNTS = ("connections", "rejected", "errors", "steps", "episodes", "steps_lost", "episodes_cut", "internal_errors")

WeightSource = Callable[[int], "tuple[int, dict] | None"]
"""(version, weights) when newer weights than `version` are published, else None."""


class SimulatorServer:
    """Serves simulators on `port` (0: any free one; `self.port` says which) with `token`; `weights` is
    where the newest published weights come from; fragments carry `worker_index`."""

    def __init__(self, cfg, token: str, port: int, weights: WeightSource, worker_index: int):
        from distrl.threads import one_compute_thread

        one_compute_thread(load_torch=True)
        ext = cfg.external
        self.cfg, self.token, self.source = cfg, token, weights
        self.max_clients, self.max_message_bytes = ext.max_clients, ext.max_message_bytes
        self.algo = make_algorithm(cfg)
        self.policy = self.algo.make_policy(-1, 1, policy_seed(cfg.seed, -1))  # the batched forward, postprocess
        self.checks = Checks(self.algo.spec, self.policy)
        self.spaces = (self.checks.obs_data, space_to_data(self.algo.spec.action_space))
        self.protocol = protocol_for(*self.spaces)  # the oldest version a client may speak to this run
        self.slots: dict[int, object] = {}  # slot -> its policy (exploration only: RNG, rule, schedule)
        self.slot_steps: dict[int, int] = {}
        self.free = list(range(self.max_clients))
        # A recurrent policy's state: each step records the one its action was taken from (remote inference:
        # the server's, kept per open episode in `Episode.state`; local: the client's), and each episode's
        # steps go into columns of their own, each storing the state before its first step (`Lanes`).
        initial = self.policy.initial_state(1)
        self.recurrent, self.state_shape = initial is not None, None if initial is None else initial.shape[1:]
        self.chunk = cfg.rollout.fragment_length
        self.assembler = (Lanes if self.recurrent else Assembler)(
            self.policy, cfg.rollout.fragment_length, cfg.env.num_envs, worker_index)
        self.worker_index = worker_index
        self.counts = dict.fromkeys(COUNTS, 0)
        self.reported = dict(self.counts)
        self.sessions: set[Session] = set()
        self.episode_ids = itertools.count()
        self.pending: list = []  # get_action requests waiting for the next batch
        self.weights_waiting: list = []  # get_weights requests waiting for a first export
        self.export: tuple[int, bytes] | None = None
        self.want_export = False
        self.paused = False
        self.failure: str | None = None
        self.last_internal_error: str | None = None
        self.no_export: str | None = None  # why the weights cannot be exported for local inference, once known
        self.ready = threading.Condition()
        self.stopping = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.port = port
        started, errors = threading.Event(), []
        self.thread = threading.Thread(target=self._serve, args=(ext.host, port, started, errors), daemon=True,
                                       name="simulator-server")
        self.thread.start()
        started.wait()
        if errors:
            raise errors[0]
        self.weights_thread = threading.Thread(target=self._weights_loop, daemon=True, name="simulator-weights")
        self.weights_thread.start()

    # --- the driver's side ------------------------------------------------------------
    def take(self, timeout_s: float) -> Fragment:
        """The oldest waiting fragment, or after `timeout_s` an empty one (`data` None, `env_steps` 0); either
        carries the counts since the last `take` in `info.counts`. RuntimeError once the server failed."""
        deadline = time.time() + timeout_s
        with self.ready:
            while not self.assembler.ready and self.failure is None and time.time() < deadline:
                self.ready.wait(max(0.0, deadline - time.time()))
        if self.failure is None and not self.thread.is_alive() and not self.stopping.is_set():
            self.failure = "its event loop stopped"
        if self.failure is not None:
            raise RuntimeError(f"the simulator server failed: {self.failure}")
        frag = self.assembler.ready.popleft() if self.assembler.ready else None
        if self.paused and len(self.assembler.ready) < MAX_READY:
            self.loop.call_soon_threadsafe(self._resume)
        if frag is None:
            frag = Fragment(None, None, FragmentInfo(self.worker_index, self.policy.version, 0, np.zeros(0),
                                                     np.zeros(0, np.int64)))
        frag.info.counts = self._counts_since()
        return frag

    def _counts_since(self) -> dict[str, int]:
        now = dict(self.counts)
        delta = {k: now[k] - self.reported[k] for k in COUNTS if now[k] != self.reported[k]}
        self.reported = now
        delta["clients"] = sum(1 for s in list(self.sessions) if s.slot is not None)  # a gauge, not a count
        return delta

    def alive(self) -> bool:
        return self.thread.is_alive() and self.failure is None

    def close(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self._shutdown)
            self.thread.join(10)
        self.weights_thread.join(10)

    # --- the event loop's thread ---------------------------------------------------------
    def _serve(self, host: str, port: int, started: threading.Event, errors: list) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.listener = self.loop.run_until_complete(
                self.loop.create_server(lambda: Session(self), host, port, reuse_address=True))
        except OSError as e:
            errors.append(OSError(f"the simulator server cannot listen on {host}:{port}: {e.strerror or e}"))
            started.set()
            return
        self.port = self.listener.sockets[0].getsockname()[1]
        self.loop.set_exception_handler(self._internal_error)
        started.set()
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _internal_error(self, loop, context: dict) -> None:
        """A fault in handling one connection's data closes that connection (asyncio's doing) and is counted;
        the server goes on with the others."""
        self.counts["internal_errors"] += 1
        self.last_internal_error = f"{context.get('message')}: {context.get('exception')!r}"

    def _fail(self, why: str) -> None:
        """A fault of the server itself (its network, its policy): it stops, as a dead process would."""
        self.failure = why
        with self.ready:
            self.ready.notify_all()
        self._shutdown()

    def _shutdown(self) -> None:
        for s in list(self.sessions):
            s.close()
            self.closed(s)  # now: the loop stops before asyncio would report the connection lost
        if getattr(self, "listener", None) is not None:
            self.listener.close()
        # Stopped a moment later: the transports close their sockets in callbacks of the loop's next pass.
        self.loop.call_later(0.05, self.loop.stop)

    def opened(self, session: Session) -> None:
        self.counts["connections"] += 1
        self.sessions.add(session)
        if self.paused:
            session.transport.pause_reading()

    def closed(self, session: Session) -> None:
        self.sessions.discard(session)
        if session.episodes is not None:
            session.episodes.close()
        if session.slot is not None:
            heapq.heappush(self.free, session.slot)
            session.slot = None

    def claim_slot(self) -> int | None:
        return heapq.heappop(self.free) if self.free else None

    def welcome(self, slot: int, protocol: int) -> dict:
        return {"type": "welcome", "protocol": protocol, "client": slot, "version": self.policy.version,
                "observation_space": self.spaces[0], "action_space": self.spaces[1],
                "max_message_bytes": self.max_message_bytes}

    def new_episode_id(self, slot: int) -> str:
        return f"{slot}-{next(self.episode_ids)}"

    def count(self, name: str) -> None:
        self.counts[name] += 1

    def observation(self, value, rows: int | None) -> tree.Tree:
        return self.checks.observations(value, rows)

    def slot_policy(self, slot: int):
        """The exploration of client slot `slot`: worker `slot` of `max_clients`' policy, its steps so far."""
        if slot not in self.slots:
            self.slots[slot] = self.algo.make_policy(slot, self.max_clients, policy_seed(self.cfg.seed, SLOT_SEED + slot))
            self.slot_steps[slot] = 0
        policy = self.slots[slot]
        policy.observe_steps(self.slot_steps[slot])
        return policy

    def stepped(self) -> None:
        """Steps went in: wake the driver for a full fragment; hold clients back while enough wait."""
        if self.assembler.ready:
            with self.ready:
                self.ready.notify_all()
        if len(self.assembler.ready) >= MAX_READY and not self.paused:
            self.paused = True
            for s in self.sessions:
                s.transport.pause_reading()

    def _resume(self) -> None:
        if self.paused and len(self.assembler.ready) < MAX_READY:
            self.paused = False
            for s in self.sessions:
                if not s.closing:
                    s.transport.resume_reading()

    # --- remote inference ------------------------------------------------------------------
    def queue_action(self, session: Session, episode: str, obs: tree.Tree, reward: float) -> None:
        self.pending.append((session, episode, obs, reward))
        if len(self.pending) == 1:  # the requests read in this pass of the loop run as one batch
            self.loop.call_soon(self._act)

    def _act(self) -> None:
        if self.policy.version < 0:  # no weights yet (the learner publishes before anything acts)
            self.loop.call_later(POLL_S, self._act)
            return
        batch, self.pending = [r for r in self.pending if not r[0].closing], []
        if not batch:
            return
        t0 = time.perf_counter()
        open_episodes = [session.episodes.open[episode] for session, episode, _, _ in batch]
        states = self._states(open_episodes)
        try:
            outputs, after = self.policy.forward(tree.stack([obs for _, _, obs, _ in batch]), states)
        except Exception as e:  # noqa: BLE001 - the network failed: the server is as good as dead
            self._fail(f"acting failed: {type(e).__name__}: {e}")
            return
        version, replies = self.policy.version, []
        for i, (session, episode, obs, reward) in enumerate(batch):
            policy = self.slot_policy(session.slot)
            actions, extras = self.rule(policy).act({k: v[i:i + 1] for k, v in outputs.items()}, policy.rng, True)
            if states is not None:  # the state it acted from goes with the step; the next one waits for its next
                extras["state"], open_episodes[i].state = states[i:i + 1], after[i]
            self.slot_steps[session.slot] += 1
            session.episodes.reward(episode, reward)
            session.episodes.act(episode, obs, actions[0], {k: v[0] for k, v in extras.items()}, version)
            replies.append({"type": "action", "action": self.checks.action_to_wire(actions[0]), "version": version})
        self.assembler.act_s += time.perf_counter() - t0
        self.stepped()  # before the replies: a client held back is held back at its next call
        for (session, *_), reply in zip(batch, replies):
            session.answered(reply)

    def _states(self, episodes) -> np.ndarray | None:
        """The recurrent state each episode acts from (zeros at its start); None for a feedforward policy."""
        if not self.recurrent:
            return None
        fresh = self.policy.initial_state(1)[0]
        return np.stack([fresh if ep.state is None else ep.state for ep in episodes])

    def rule(self, policy):
        """How `policy` (a slot's) picks actions from its network's outputs: a recurrent policy names its rule
        with `sampling_rule()` (its `acting_rule()` is None: a rule that runs no state)."""
        return policy.sampling_rule() if self.recurrent else policy.acting_rule()

    # --- local inference --------------------------------------------------------------------
    def queue_weights(self, session: Session, have: int) -> dict | None:
        """The weights reply, or None when it waits for the first export (`session.answered` then)."""
        if self.recurrent and session.protocol < 2:
            raise ProtocolError("unavailable", f"this run's {self.algo.name} policy is recurrent: local inference "
                                               "sends each step's state, which protocol 2 carries (this client "
                                               "speaks 1; inference: remote acts on the server)")
        if self.no_export:
            raise ProtocolError("unavailable", self._unavailable())
        self.want_export = True
        if self.export is None:
            self.weights_waiting.append((session, have))
            return None
        return self._weights_reply(session, have)

    def _weights_reply(self, session: Session, have: int) -> dict:
        version, model = self.export
        if have == version:
            model = None
        elif session.encoding == "json":
            model = base64.b64encode(model).decode()
        reply = {"type": "weights", "version": version, "model": model,
                 "rule": self.rule(self.slot_policy(session.slot)).to_wire()}
        if self.recurrent:  # (S, C): what the model's `state` input takes per row, and each step's extras carry
            reply["state"] = list(self.state_shape)
        return reply

    def _no_export(self, why: str) -> None:
        """The weights cannot be exported here: every get_weights, waiting or to come, is refused."""
        self.no_export = why
        waiting, self.weights_waiting = self.weights_waiting, []
        for session, _ in waiting:
            session.busy = False
            session.fail(ProtocolError("unavailable", self._unavailable()))
            session.drain()

    def _unavailable(self) -> str:
        return f"local inference needs the run's weights as ONNX (pip install distrl[onnx]): {self.no_export}"

    def _exported(self, version: int, model: bytes) -> None:
        self.export = (version, model)
        waiting, self.weights_waiting = self.weights_waiting, []
        for session, have in waiting:
            if not session.closing:
                session.answered(self._weights_reply(session, have))

    def segment(self, seg, episodes) -> tuple:
        return self.checks.segment(seg, episodes, MAX_OPEN_EPISODES, self.newest_version())

    def newest_version(self) -> int:
        return max(self.policy.version, self.export[0] if self.export else -1)

    def apply_segment(self, episodes, slot: int, episode: str, start: bool, rows: dict | None, end) -> int:
        """Apply one checked segment of a local client's experience: its steps, in order, then its end."""
        if start:
            problem = episodes.start(episode)
            if problem:
                raise ProtocolError("out_of_order", problem)
        k = 0 if rows is None else len(rows["rewards"])
        if k:
            episodes.extend(episode, rows["obs"], rows["actions"], rows["extras"], rows["versions"], rows["rewards"])
        if end is not None:
            episodes.end(episode, *end)
        self.slot_steps[slot] = self.slot_steps.get(slot, 0) + k
        self.stepped()
        return k

    # --- the weights' thread ------------------------------------------------------------------
    def _weights_loop(self) -> None:
        """Look for newer weights every POLL_S, load them on the loop's thread; export them for local
        clients (on this thread, with a network of its own) at most every EXPORT_INTERVAL_S."""
        known, newest, exported_at, exporter = -1, None, 0.0, None
        while not self.stopping.is_set() and self.failure is None:
            try:
                got = self.source(known)
            except Exception:  # noqa: BLE001 - a source that is down (a parameter server restarting): try again
                got = None
            if got is not None:
                known, newest = got[0], got
                self.loop.call_soon_threadsafe(self.policy.set_weights, got[1], got[0])
            due = time.time() - exported_at >= EXPORT_INTERVAL_S
            if self.want_export and newest is not None and due and (self.export is None or self.export[0] != known):
                exporter = exporter or self.algo.make_policy(-1, 1, 0)
                exported_at = time.time()
                try:
                    model = export_onnx(exporter, *newest)
                except Exception as e:  # noqa: BLE001 - no onnx package here: local inference is refused, not the run
                    self.loop.call_soon_threadsafe(self._no_export, f"{type(e).__name__}: {e}")
                    return
                self.loop.call_soon_threadsafe(self._exported, newest[0], model)
            self.stopping.wait(POLL_S)


def export_onnx(policy, version: int, weights: dict) -> bytes:
    """The policy's acting network with `weights`, as ONNX bytes."""
    from distrl.models.export import acting_network, example_batch, onnx_bytes

    policy.set_weights(weights, version)
    return onnx_bytes(acting_network(policy), example_batch(policy.acting_space))

