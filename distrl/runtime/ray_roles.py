"""`sync` and `async` modes: every role is a Ray actor; the driver only moves refs.

The two modes differ only in their gather strategy (`SyncGather`, `AsyncGather`):
which fragments the driver takes each iteration and whether it waits for the
learner. Every role may die or hang: Ray restarts a dead one, a hung one is ended
first (`Heartbeats`, on a thread of its own), each restart is counted when Ray
reports the death (`ActorTable`), and the recovery is the role's own (see
`_recover`). No wait on a role is longer than a second without the driver looking
at the roles and at the run's stop; once the run has stopped, none lasts past the
wind-down's deadline (`wind_down`).
"""
from __future__ import annotations

import time
import uuid

import ray
from ray.exceptions import RayTaskError
from ray.util.placement_group import remove_placement_group

from distrl.config import Config
from distrl.core import Gathered, Restarts, RoleLost, RoleRestarted, Roles, RunState, Stopping, TrainStats
from distrl.envs.normalize import merged
from distrl.observe.startup import StartupLine
from distrl.roles.experience import newest_store, write_store
from distrl.roles.factory import trace_settings
from distrl.runtime.actor_base import start_tracing
from distrl.runtime.counters import plus, restarts_in
from distrl.runtime.deaths import ActorTable, keep_ray_text_off_the_console
from distrl.runtime.faultlog import FaultLog
from distrl.runtime.ray_start import start_roles
from distrl.runtime.ray_startup import wait_for_started
from distrl.runtime.ray_setup import ACTOR_GONE, init_ray, settle, user_modules
from distrl.runtime.ray_eval import EvalCalls
from distrl.runtime.ray_traces import ActorTraces
from distrl.runtime.watch import end_silent

SLICE_S = 1.0  # longest wait on a role before the driver looks at every role's health again


class RayRoles(Roles):
    """ParameterServer, ReplayServer, Learner, Evaluator and N RolloutWorkers as actors."""

    def __init__(self, cfg: Config, run_dir: str, start_time: float, address: str | None = None,
                 eval_resume: dict | None = None, startup: StartupLine | None = None):
        """`startup`: where the start is said on the console (none: silent)."""
        self.startup = startup or StartupLine(start_time, enabled=False)
        began = time.time()
        init_ray(address, user_modules(cfg.model))
        self.startup.say(f"Ray up in {time.time() - began:.1f} s")
        start_tracing(trace_settings(cfg.log), "driver")  # labelled with its Ray node, as the actors are
        self.cfg, self.run_dir = cfg, run_dir
        self.group = self.worker_group = self.pool = None
        self.gradient_workers, self.inference = [], []
        self.learner = self.evaluator = self.replay = self.ps = None
        self.replay_refilled = 0  # items restarted replay servers got back from checkpoints
        self.learner_state = None  # what a restarted learner is restored to (set once the roles are up)
        self.restarts_before = Restarts()  # a resumed run's, from its checkpoint
        self.evals = EvalCalls(eval_resume)  # the evaluation in flight, and the run's so far
        self.ticking = False
        self.wind_down_by: float | None = None  # set once the run has stopped: no wait lasts past it
        self.watching_hangs = False  # in the wind-down: whether hung roles are still ended (a long checkpoint)
        self.unrecovered: set[str] = set()  # roles back as a new process, not yet put back in the run
        self.train_calls: dict = {}  # in-flight learner call -> updates asked
        self.rewound: list[TrainStats] = []  # learner restores to report with the next train()
        self.statistics: list = []  # env.normalize statistics of fragments gathered, for the next learner call
        self.trace = ActorTraces()  # what the actors recorded, pulled at checkpoints
        self.timings = {"env_s": 0.0, "inference_s": 0.0, "pull_s": 0.0, "learner_s": 0.0, "learner_wait_s": 0.0}
        self.faults = FaultLog(run_dir, start_time)
        keep_ray_text_off_the_console(self.faults)
        self.table = ActorTable(self.faults)
        self.beats = None  # every process's heartbeat, on a thread of its own once the roles are up
        try:
            start_roles(self, cfg, start_time, address, eval_resume, f"distrl-{uuid.uuid4().hex[:10]}")
            self.watch.interrupt = self._check_stop
            self._get(self.learner.publish.remote(), "learner")  # version 0 exists before any worker acts
            # What a restarted learner is restored to: the newest checkpoint's state, or this one before it.
            self.learner_state = self._get(self.learner.get_state.remote(), "learner")
            self.beats.start()
        except BaseException:  # nothing of a run that failed to start stays on the cluster
            self.close()
            raise

    def _wait_for_roles(self) -> None:
        wait_for_started(self)  # every role, and the workers started by then, said on the console as each answers

    @property
    def workers(self) -> list:
        return self.pool.workers if self.pool is not None else []

    # --- workers ------------------------------------------------------------------
    def gather(self, allow_sampling: bool) -> Gathered:
        self._tick()
        pairs, failed, ready, late = self.pool.gather(allow_sampling, between=self._tick)  # a sync wait too
        adds = [self.replay.add.remote(data_ref) for info, data_ref in pairs if info.env_steps]  # a simulator
        # server's call that found no fragment carries only its counts
        if self.pool.gatherer.waits_for_learner and adds:
            try:
                self._get(adds, "replay")  # the learner must see this data before it trains
            except RoleRestarted:  # the replay server died under these adds: their fragments are lost
                pairs, failed = [], failed + len(pairs)
        infos = [info for info, _ in pairs]
        self.statistics += [info.statistics for info in infos if info.statistics]
        for info in infos:
            for k, v in info.timings.items():
                self.timings[k] = self.timings.get(k, 0.0) + v
        if self.pool.all_lost():
            raise RoleLost(f"every rollout worker stayed unreachable for {self.cfg.fault.worker_timeout_s:.0f} s")
        return Gathered(infos, ready=ready, late=late, failed=failed)

    def _tick(self) -> None:
        """Look at every role: restarted ones are put back in the run (hung ones are ended meanwhile by the
        heartbeats' thread, and Ray restarts them); `Stopping` once the run's stop has come. Not from inside a
        recovery (its own waits only wait: a recovery is quick, and a checkpoint must never see a role half
        put back)."""
        if self.ticking:
            return
        if self.wind_down_by is None:
            self.evals.take()
        self._check_stop()
        if self.wind_down_by is not None:  # the run has stopped: nothing is restarted or put back now
            if self.watching_hangs:
                self.beats.look()
            return
        self.ticking = True
        try:
            for name in self.watch.poll():
                try:
                    self._recover(name)
                except RoleRestarted:  # it, or a role its recovery called, died again: recovered in there
                    pass
            if self.pool is not None:
                self.pool.check()
        finally:
            self.ticking = False

    def _check_stop(self) -> None:
        """`Stopping` once the run's stop has come (a solving evaluation's result in too), and once it has
        stopped, when the wind-down's time is up. A recovery under way is not cut short by the stop."""
        if self.wind_down_by is not None:
            if time.time() >= self.wind_down_by:
                raise Stopping("not done within the run's wind-down")
        elif not self.ticking and (self.stop_due() or self.evals.solved()):
            raise Stopping("the run's stop came")

    def _slice(self) -> float:
        """How long one wait may last before the next look: a second, less near the wind-down's deadline."""
        return SLICE_S if self.wind_down_by is None else max(0.01, min(SLICE_S, self.wind_down_by - time.time()))

    def _get(self, refs, role: str | None = None):
        """ray.get that never hangs a run: it waits a second at a time, looking at every role's heartbeat in
        between, so a hung role the call waits on is ended and restarted meanwhile. A role that died under
        the call (or was ended) is waited for and put back in the run, and the call raises `RoleRestarted`
        (its result is lost). A call to a role that keeps its heartbeat is waited for however long it takes,
        until the run's stop (`Stopping`); once the run has stopped, a death under it is `Stopping` too."""
        waiting = list(refs) if isinstance(refs, list) else [refs]
        try:
            while waiting:
                _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=self._slice())
                if waiting:
                    self._tick()
            return ray.get(refs)
        except (*ACTOR_GONE, RayTaskError) as e:
            name = self._died(e)
            if name is None:  # not a death: a fault of the code the call ran
                raise
            if self.wind_down_by is not None:
                raise Stopping(f"the {name.replace('_', ' ')} is gone") from None
            self._bring_back(name)
            raise RoleRestarted(f"the {name.replace('_', ' ')} died during a call") from None

    def _died(self, err: Exception) -> str | None:
        """The role whose death `err` reports, "unknown" if Ray does not say which, None if not a death.
        A call that failed because another actor died under it is an instance of that death too."""
        if not isinstance(err, ACTOR_GONE):
            return None
        ids = {actor._actor_id.hex(): name for name, actor in self.watch.actors.items()}
        return ids.get(getattr(err, "actor_id", None), "unknown")

    def _bring_back(self, name: str) -> None:
        """Wait until the role answers again (`RoleLost` if it does not in time) and put it back in the run."""
        if name.startswith("gradient_worker"):  # the learner retried its shard on a restart: it is gone for good
            raise RoleLost(f"{name.replace('_', ' ')} died and did not come back")
        for role in (self.watch.actors if name == "unknown" else [name]):
            self.unrecovered.add(role)  # until put back (the run's stop may cut the wait short)
            if self.watch.wait_for(role):
                self._recover(role)
            self.unrecovered.discard(role)

    # --- learner ------------------------------------------------------------------
    def train(self, budget: int, final: bool = False) -> list[TrainStats]:
        """Async keeps two calls queued at the learner so it never waits on the driver;
        sync waits for each call (the next round must see the new weights)."""
        done, self.rewound = self.rewound, []
        if self.train_calls:  # `final`: waited for until the wind-down's deadline
            wait_s = max(0.0, (self.wind_down_by or time.time()) - time.time()) if final else 0
            ready, _ = ray.wait(list(self.train_calls), num_returns=len(self.train_calls), timeout=wait_s)
            done.extend(s for ref in ready for s in self._train_result(ref))
        max_queued = 1 if self.pool.gatherer.waits_for_learner else 2
        while not final and budget > 0 and len(self.train_calls) < max_queued:
            # Cap each call so the driver regains control often enough to log and stop.
            n = min(budget, 4 * self.cfg.learner.batches_per_call)
            ref = self.learner.train.remote(n, merged(self.statistics) if self.statistics else None)
            self.statistics = []
            self.train_calls[ref] = n
            budget -= n
            if self.pool.gatherer.waits_for_learner:
                done.extend(self._train_result(ref))
        if final and not self.pool.gatherer.waits_for_learner:  # its calls left their last weights unpublished
            try:
                self._get(self.learner.publish.remote(), "learner")
            except RoleRestarted:  # restored from a checkpoint, whose weights it published
                pass
        for s in done:
            self.timings["learner_s"] += s.learner_s
            self.timings["learner_wait_s"] += s.wait_s
        return done

    def _train_result(self, ref) -> list[TrainStats]:
        """A learner call's stats; after a death under it (the learner's, or the replay server's), the
        role's recovery, and the call's updates are not counted (the learner's state says what stands)."""
        self.train_calls.pop(ref, None)
        try:
            return [self._get(ref, "learner")]
        except RoleRestarted:  # already recovered; a restored learner's rewind is reported instead
            done, self.rewound = self.rewound, []
            return done

    def _recover(self, name: str) -> None:
        """A role came back as a new process: put it back in the run (it stays in `unrecovered` if this is cut
        short)."""
        self.unrecovered.add(name)
        self._put_back(name)
        self.unrecovered.discard(name)

    def _put_back(self, name: str) -> None:
        if name == "learner" and self.learner_state is not None:
            # Its in-flight calls died with it; its state goes back to the newest checkpoint's, and its
            # weights replace those of the updates that were lost.
            self.train_calls.clear()
            version = self._get(self.learner.set_state.remote(self.learner_state), "learner")
            self.rewound.append(TrainStats(rewound_to=int(self.learner_state["state"]["updates"]), version=version))
        elif name == "parameter_server":
            self.learner.publish.remote()  # it came back empty: the learner's newest weights, now
        elif name == "replay":
            # It came back empty: the newest checkpoint's store, read where the replay runs when that is the
            # driver's node (no copy through the object store), else read here and sent.
            on_this_node = self.replay_on_driver_node()
            self.replay_refilled += self._get(self.replay.refill.remote(
                self.run_dir if on_this_node else None, None if on_this_node else newest_store(self.run_dir)), "replay")
        elif name == "evaluator":  # the run's evaluations and best so far, as a single-mode evaluator restarts with
            self.evaluator.resume.remote(**self.evals.progress)
        # The inference server pulls the weights before it answers; workers give it their envs' recurrent
        # states back (`RemoteInference`). A gradient worker needs nothing.

    def updates_in_flight(self) -> int:
        return sum(self.train_calls.values())

    # --- checkpoints ----------------------------------------------------------------
    def get_state(self) -> RunState:
        """Everything a checkpoint needs from the actors (waits for in-flight calls to finish)."""
        if self.cfg.log.trace:
            self.trace.pull(self.actors())
        if {"learner", "replay"} & self.unrecovered:
            raise Stopping(f"the {' and '.join(sorted(self.unrecovered))} came back at the stop, not yet restored")
        learner = self.learner.get_state.remote()
        workers = [w.get_state.remote() for w in self.workers]
        for name in ("replay", "parameter_server") if self.wind_down_by is None else ():
            if self.watch.wait_for(name):  # a restart since the last look: counted and handled
                self._recover(name)
        state = {"learner": self._get(learner, "learner"), "store": self._store_writer(),
                 "workers": self._get_workers(workers)}
        if state["learner"] is not None:
            self.learner_state = state["learner"]
        return state

    def _get_workers(self, refs: list) -> list[dict]:
        """Each worker's state; a worker that is down or hangs, or that has not answered by the wind-down's
        deadline, has none (it restarts from a fresh state)."""
        waiting, deadline = list(refs), min(time.time() + self.cfg.fault.worker_timeout_s, self.wind_down_by or 1e18)
        while waiting and time.time() < deadline:
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=max(0.01, min(SLICE_S, deadline - time.time())))
            if waiting and self.wind_down_by is None:
                self._tick()  # a hung worker is ended: its call fails
        out = []
        for ref in refs:
            try:
                out.append(None if ref in waiting else ray.get(ref))
            except (*ACTOR_GONE, RayTaskError):
                out.append(None)
        return out

    def replay_on_driver_node(self) -> bool:
        return self._get(self.replay.node_id.remote(), "replay") == ray.get_runtime_context().get_node_id()

    def _store_writer(self):
        max_bytes = self.cfg.checkpoint.max_replay_bytes
        if self.replay_on_driver_node():  # same disk: the server writes its own file
            return lambda directory: self._get(self.replay.write.remote(directory, max_bytes), "replay")
        return lambda directory: write_store(directory, self._get(self.replay.state.remote(max_bytes), "replay"))

    def store_digest(self) -> str | None:
        return self._get(self.replay.digest.remote(), "replay")

    def replay_bytes_per_item(self) -> float | None:
        return self._get(self.replay.bytes_per_item.remote(), "replay")

    def set_state(self, state: RunState) -> None:
        refs = [w.set_state.remote(s) for w, s in zip(self.workers, state["workers"]) if s is not None]
        if state["store"] is not None:
            refs.append(self.replay.load.remote(state["store"]))
        self._get(refs)
        self._get(self.learner.set_state.remote(state["learner"]), "learner")
        self.learner_state = state["learner"]
        self.restarts_before = restarts_in(state)

    # --- evaluator ------------------------------------------------------------------
    def submit_eval(self, env_steps: int, wait: bool = False) -> bool:
        return self.evals.submit(self.evaluator, env_steps)

    def poll_eval(self, block: bool = False, timeout: float | None = None) -> list[dict]:
        deadline = time.time() + ((1e9 if timeout is None else timeout) if block else 0.0)
        while self.evals.ref is not None:
            ready, _ = ray.wait([self.evals.ref], timeout=max(0.0, min(self._slice(), deadline - time.time())))
            if ready or time.time() >= deadline:
                break
            self._tick()  # a hung evaluator is ended meanwhile: its call fails
        self.evals.take()
        return self.evals.drain()

    def eval_busy(self) -> bool:
        return self.evals.ref is not None

    # --- the rest of the contract -----------------------------------------------------
    def wind_down(self, deadline: float, watch_hangs: bool = False) -> list[str]:
        """From now on no wait lasts past `deadline`; the first time, the processes that do not answer a
        heartbeat within a moment (hung, coming back, or back and not yet put back in the run) are ended with
        no restart, and their calls fail at once. `watch_hangs`: until the next call, a role that stops
        answering its heartbeat is ended (its call fails), as before the stop: for a wait that may be long."""
        first, self.wind_down_by, self.watching_hangs = self.wind_down_by is None, deadline, watch_hangs
        if not first:
            return []
        self.beats.close()  # nothing is ended as hung, or restarted, from now on
        return end_silent(self.watch, self.pool, self.unrecovered)

    def restarts(self, exact: bool = False) -> Restarts:
        """Every role's restarts as Ray counted them (`exact`: a process killed just now is counted too)."""
        if exact:
            wait_s = min(5.0, self.cfg.fault.role_timeout_s)
            if self.wind_down_by is None:
                self._tick()
            else:
                wait_s = max(0.0, min(wait_s, self.wind_down_by - time.time()))
            self.table.settle(wait_s)
            self.pool.settle(wait_s)
        self.table.poll()
        t, pids = self.table, self.watch.new_processes
        count = (lambda role: t.restarts(role)) if t.readable else (
            lambda role: sum(n for name, n in pids.items() if name.startswith(role.rstrip("s"))))
        return plus(self.restarts_before, Restarts(
            workers=self.pool.restarts, evaluator=count("evaluator"), replay=count("replay"), learner=count("learner"),
            parameter_server=count("parameter_server"), workers_lost=len(self.pool.lost),
            inference=count("inference"), gradient_workers=count("gradient_workers"),
            replay_refilled=self.replay_refilled, external=t.restarts("external") if t.readable else 0))

    def time_breakdown(self) -> dict[str, float]:
        return dict(self.timings)

    def traces(self) -> list[dict]:
        if not self.cfg.log.trace:
            return []
        return self.trace.drains(self.actors(), deadline=min(time.time() + 30, self.wind_down_by or 1e18))

    def _settle_calls(self) -> None:
        """Read the outcome of learner calls still in flight (a run that ended on a fault), waiting a moment,
        so that Ray does not print one that failed as an unhandled error: a learner call fails once a hung
        replay server it waits on is ended."""
        settle(list(getattr(self, "train_calls", {})), 1.0)

    def actors(self) -> list:
        roles = (self.learner, self.evaluator, self.replay, self.ps)
        return [*self.workers, *(a for a in roles if a is not None), *self.gradient_workers, *self.inference]

    def close(self) -> None:
        if self.beats is not None:
            self.beats.close()
        self._settle_calls()
        self.table.close()
        # A simulator in a process of its own (VizDoom's game) outlives a killed actor: workers close envs first.
        settle([worker.close.remote() for worker in self.workers], 2.0)
        for actor in self.actors():
            ray.kill(actor)
        keep_ray_text_off_the_console(None)
        for group in (self.group, getattr(self, "worker_group", None)):  # _start may have failed before either
            if group is not None:
                remove_placement_group(group)

