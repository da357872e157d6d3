"""A simulator's side of a run: `Client` connects to the run's simulator server and trains it from a loop
the simulator owns (docs/guides/external-simulators.md; the protocol: docs/reference/protocol.md).

    client = Client.from_run_dir("runs/mine")          # or Client("127.0.0.1:40123", token)
    episode = client.start_episode()
    action = client.get_action(episode, obs)           # then step the simulator with it
    client.log_returns(episode, reward)
    client.end_episode(episode, final_obs)

`get_actions(episode_ids, observations)` asks for several open episodes' actions at once (local inference:
one pass of the network for all of them).

An observation is what the run's observation space says (`welcome`, `distrl.client.spaces`): an array, or
for a Dict or Tuple space a dict or tuple of arrays (nested as the space is), its action mask, if any, as
its `action_mask` key. Actions are ints (Discrete) or arrays (Box, MultiDiscrete, MultiBinary).

Two inference modes: `remote` (the server runs the policy and answers each `get_action`) and `local`
(the client pulls the newest weights as an ONNX file every `weights_interval_s` and acts itself with
onnxruntime, sending its experience in batches of `send_steps` steps: by default 256, or 64 acting calls'
rows for a simulator acting for many episodes at once, whichever is more). For a recurrent policy, local
inference keeps each open episode's state (zeros at its start), feeds it to the file and sends it with each
step. Imports numpy and msgpack only (and onnxruntime for local inference): no torch, no Ray.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import time
import uuid

import numpy as np

from distrl.client import spaces as wire_spaces
from distrl.client import wire
from distrl.client.steps import StepBuffer

__all__ = ["Client", "ServerError"]

SEND_STEPS, SEND_CALLS = 256, 64  # local inference's default batch: steps, or acting calls' rows if more


class ServerError(Exception):
    """The server refused a message: `code` says why (docs/reference/protocol.md, errors)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class _Episode:
    """An open episode on the client: the reward since its last action (local inference: before its first)
    and, in local inference, where its newest step not yet sent is in the client's `StepBuffer`."""

    def __init__(self, slot: int):
        self.reward = 0.0
        self.slot = slot  # tags its rows in the step buffer
        self.last: tuple[int, int] | None = None  # (block, row) of its newest unsent step
        self.started = False  # the server knows it (local inference: a batch carried its start)
        self.end: tuple | None = None  # (final obs, truncated) once ended
        self.state = None  # local inference of a recurrent policy: its state for its next action (None: zeros)


class Client:
    def __init__(self, address, token: str, *, inference: str = "remote", encoding: str = "msgpack",
                 weights_interval_s: float = 10.0, send_steps: int | None = None, reconnect_s: float = 60.0,
                 seed: int | None = None, name: str = ""):
        """`address`: "host:port" or (host, port). `reconnect_s`: how long a lost connection is retried (the
        server restarting, or not up yet) before the call raises. `send_steps` (local inference): steps per
        experience message; None: 256, or 64 acting calls' rows where a call acts for many episodes. A batch
        also goes once it holds half the server's `max_message_bytes`."""
        if inference not in ("remote", "local"):
            raise ValueError(f"inference must be remote or local, got {inference!r}")
        if encoding not in wire.ENCODINGS:
            raise ValueError(f"encoding must be one of {wire.ENCODINGS}, got {encoding!r}")
        host, _, port = address.rpartition(":") if isinstance(address, str) else (address[0], "", address[1])
        self.address = (host, int(port))
        self.token, self.inference, self.encoding, self.name = token, inference, encoding, name
        self.weights_interval_s, self.send_steps, self.reconnect_s = weights_interval_s, send_steps, reconnect_s
        self.rng = np.random.default_rng(seed)
        self.sock: socket.socket | None = None
        self.episodes: dict[str, _Episode] = {}
        self.actor = None  # local inference: the newest weights as an onnxruntime session (`LocalActor`)
        self.pulled_at = 0.0
        self.welcome: dict = {}
        self.steps = StepBuffer()  # local inference: rows held for the next batch
        self.batch_rows = send_steps or SEND_STEPS
        self.slots = itertools.count()
        self._sent: tuple = ()  # what the last experience message carried (`_experience_message`)
        self._request(lambda: None)  # connect now: a wrong token or address fails here

    @classmethod
    def from_run_dir(cls, run_dir: str, wait_s: float = 120.0, **kwargs) -> "Client":
        """A client of the run in `run_dir`, from the address and token it wrote (external.json), waited for
        up to `wait_s`: a simulator may start before the run."""
        path, deadline = os.path.join(run_dir, "external.json"), time.time() + wait_s
        while not os.path.exists(path) and time.time() < deadline:
            time.sleep(0.1)
        with open(path) as fh:
            info = json.load(fh)
        return cls(f"{info['host']}:{info['port']}", info["token"], **kwargs)

    @property
    def observation_space(self) -> dict:
        return self.welcome["observation_space"]

    @property
    def action_space(self) -> dict:
        return self.welcome["action_space"]

    # --- the four calls --------------------------------------------------------------
    def start_episode(self, episode_id: str | None = None) -> str:
        episode_id = str(episode_id) if episode_id is not None else uuid.uuid4().hex
        if episode_id in self.episodes:
            raise ValueError(f"episode {episode_id!r} is already open")
        self.episodes[episode_id] = _Episode(next(self.slots))
        if self.inference == "remote":
            self._request(lambda: {"type": "start_episode", "episode": episode_id})
            self.episodes[episode_id].started = True
        return episode_id

    def get_action(self, episode_id: str, obs):
        """The action to take on `obs` (the server's policy, or this client's copy of it): for a Dict or
        Tuple observation a dict or tuple of arrays (its mask, if any, as its `action_mask` key)."""
        ep = self._open(episode_id)
        leaves = self._leaves(obs)
        if self.inference == "local":
            return self._act_rows([ep], {name: a[None] for name, a in leaves.items()})[0]
        reward, ep.reward = ep.reward, 0.0
        reply = self._request(lambda: {"type": "get_action", "episode": episode_id, "reward": reward,
                                       "obs": self._pack_obs(leaves)})
        return self._action(reply["action"])

    def get_actions(self, episode_ids, obs) -> list:
        """The actions to take in several open episodes at once (a simulator running many), `obs` their
        observations stacked, one row per episode in every leaf (an array of rows; for a Dict observation a
        dict of them, as a gymnasium vector env gives it). Local inference acts on all rows in one pass of
        the network; remote inference asks the server once per episode (the protocol carries one
        observation per get_action)."""
        eps = [self._open(e) for e in episode_ids]
        try:
            leaves = self._leaves(obs)  # copies: a vectorized simulator writes its next rows in place
        except ValueError as e:
            raise ValueError(f"{e} (get_actions takes the observations stacked leaf by leaf: "
                             "{key: np.stack([o[key] for o in observations]), ...})") from None
        if any(a.shape[:1] != (len(eps),) for a in leaves.values()):
            rows = sorted({len(a) if a.ndim else 1 for a in leaves.values()})  # a 0-d leaf: one observation
            raise ValueError(f"{len(eps)} episodes but {' or '.join(map(str, rows))} observations")
        if self.inference == "local":
            return self._act_rows(eps, leaves)
        space = self.observation_space
        return [self.get_action(e, wire_spaces.nest(space, {name: a[i] for name, a in leaves.items()}))
                for i, e in enumerate(episode_ids)]

    def log_returns(self, episode_id: str, reward: float) -> None:
        """Add `reward` to what the episode's last action earned."""
        ep = self._open(episode_id)
        if self.inference == "local" and ep.last is not None:
            self.steps.add_reward(ep.last, float(reward))
        else:
            ep.reward += float(reward)

    def end_episode(self, episode_id: str, obs, truncated: bool = False) -> None:
        """The episode is over at `obs`: terminated (no value after it), or `truncated` (a time limit: its
        value is bootstrapped from `obs`)."""
        ep = self._open(episode_id)
        leaves = self._leaves(obs)
        if self.inference == "local":
            ep.end = (leaves, bool(truncated))
            self._send_experience(force=False)
            return
        try:  # open until the server has it: a connection made again meanwhile announces it first
            self._request(lambda: {"type": "end_episode", "episode": episode_id, "reward": ep.reward,
                                   "truncated": bool(truncated), "obs": self._pack_obs(leaves)})
        finally:
            del self.episodes[episode_id]

    def close(self) -> None:
        """Send what local inference holds of ended episodes, and leave (open episodes are cut)."""
        if self.sock is None:
            return
        try:
            if self.inference == "local":
                self._send_experience(force=True)
            wire.send(self.sock, {"type": "bye"}, self.encoding)
            wire.receive(self.sock)
        except (OSError, ConnectionError, wire.ProtocolError):
            pass
        self._drop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- observations and actions ------------------------------------------------------
    def _leaves(self, obs) -> dict[str, np.ndarray]:
        """`obs` (one observation, or rows of them) read against the observation space: its leaves by name
        (`distrl.client.spaces`), copied, in their stored dtypes; ValueError for a missing or extra leaf."""
        named = {}

        def leaf(name: str, space: dict, value) -> None:
            named[name] = np.array(value, wire_spaces.leaf_dtype(space))
        wire_spaces.read(self.observation_space, obs, leaf)
        return named

    def _pack_obs(self, leaves: dict[str, np.ndarray]):
        """Named leaves as the wire carries the observation: shaped like its space, each leaf an array object."""
        return wire_spaces.nest(self.observation_space, {name: self._pack(a) for name, a in leaves.items()})

    def _action(self, value):
        """An action as the server sent it: an int (Discrete) or an array in the action space's dtype."""
        space = self.action_space
        return value if space["type"] == "discrete" else wire.unpack_array(value, wire_spaces.leaf_dtype(space))

    # --- local inference ------------------------------------------------------------
    def _act_rows(self, eps: list[_Episode], obs: dict[str, np.ndarray]) -> list:
        if self.actor is None or time.time() - self.pulled_at >= self.weights_interval_s:
            self._pull_weights()
        state = None
        if self.actor.state_shape is not None:  # each episode's own state: zeros at its start
            state = self.actor.initial_state(len(eps))
            for i, ep in enumerate(eps):
                if ep.state is not None:
                    state[i] = ep.state
        actions, extras, after = self.actor.act_rows(obs, self.rng, state)
        if after is not None:
            for i, ep in enumerate(eps):
                ep.state = after[i]
        rewards = np.array([ep.reward for ep in eps], np.float64)
        block = self.steps.add(np.array([ep.slot for ep in eps], np.int64), obs, actions, extras,
                               self.actor.version, rewards)
        for i, ep in enumerate(eps):
            ep.last, ep.reward = (block, i), 0.0
        self.batch_rows = self.send_steps or max(SEND_STEPS, SEND_CALLS * len(eps))
        self._send_experience(force=False)
        return list(actions)

    def _pull_weights(self) -> None:
        from distrl.client.local import LocalActor

        have = -1 if self.actor is None else self.actor.version
        reply = self._request(lambda: {"type": "get_weights", "version": have})
        self.pulled_at = time.time()
        if reply.get("model") is not None:
            self.actor = LocalActor(reply["model"], reply["rule"], int(reply["version"]))
        elif self.actor is not None:
            self.actor.set_rule(reply["rule"])

    def _send_experience(self, force: bool) -> None:
        """One batch of every episode's steps whose reward is final (an open episode's last step waits for
        its next action); ended episodes leave. `force`: send even a small batch."""
        if not force and self.steps.rows < self.batch_rows and \
                self.steps.nbytes < self.welcome.get("max_message_bytes", wire.MAX_MESSAGE_BYTES) // 2:
            return
        sent, held, columns, hold = self._request(self._experience_message, keep=True)
        self.steps.keep(columns, hold)
        for j, ep in enumerate(held):
            ep.last = (0, j)
        for episode_id in sent:
            ep = self.episodes[episode_id]
            ep.started = True
            if ep.end is not None:
                del self.episodes[episode_id]

    def _experience_message(self) -> dict:
        held = [ep for ep in self.episodes.values() if ep.end is None and ep.last is not None]
        columns, hold, rows = self.steps.split([ep.last for ep in held])
        segments, sent = [], []
        for episode_id, ep in self.episodes.items():
            mine = rows.get(ep.slot)
            if mine is None and ep.end is None:
                continue
            seg = {"episode": episode_id, "start": not ep.started, "end": None}
            if mine is not None:
                obs = {k[2:]: v[mine] for k, v in columns.items() if k.startswith("o/")}
                seg.update(obs=self._pack_obs(obs), actions=self._pack(columns["actions"][mine]),
                           rewards=self._pack(columns["rewards"][mine].astype(np.float32)),
                           versions=self._pack(columns["versions"][mine]),
                           extras={k[2:]: self._pack(v[mine]) for k, v in columns.items() if k.startswith("x/")})
            if ep.end is not None:
                seg["end"] = {"obs": self._pack_obs(ep.end[0]), "truncated": ep.end[1]}
            segments.append(seg)
            sent.append(episode_id)
        self._sent = (sent, held, columns, hold)
        return {"type": "experience", "episodes": segments}

    def _pack(self, a: np.ndarray) -> dict:
        return wire.pack_array(a, self.encoding)

    # --- the connection -----------------------------------------------------------------
    def _request(self, message, keep: bool = False):
        """Send `message()` and return the reply; a lost connection is made again (and the open episodes
        announced again) for up to `reconnect_s` before the error is raised. `keep`: return what building
        the message recorded (`_sent`) instead of the reply."""
        deadline, wait = time.time() + self.reconnect_s, 0.05
        while True:
            try:
                if self.sock is None:
                    self._connect()
                msg = message()
                if msg is None:
                    return None
                wire.send(self.sock, msg, self.encoding)
                reply = wire.receive(self.sock)
                break
            except (OSError, ConnectionError) as e:
                self._drop()
                if time.time() + wait > deadline:
                    raise ConnectionError(f"no simulator server at {self.address[0]}:{self.address[1]} "
                                          f"({e}) for {self.reconnect_s:g} s") from None
                time.sleep(wait)
                wait = min(2 * wait, 1.0)
        if reply.get("type") == "error":
            raise ServerError(str(reply.get("error")), str(reply.get("message")))
        return self._sent if keep else reply

    def _connect(self) -> None:
        for protocol in sorted(wire.PROTOCOLS, reverse=True):  # the newest first; a server of distrl < 2 speaks 1
            sock = socket.create_connection(self.address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = sock
            wire.send(sock, {"type": "hello", "protocol": protocol, "token": self.token,
                             "inference": self.inference, "name": self.name}, self.encoding)
            reply = wire.receive(sock)
            if reply.get("type") != "error":
                break
            self._drop()
            if reply.get("error") != "bad_version" or protocol == min(wire.PROTOCOLS):
                raise ServerError(str(reply.get("error")), str(reply.get("message")))
        self.welcome = reply
        for episode_id, ep in self.episodes.items():  # a new connection knows none of them
            if self.inference == "remote" and ep.started:  # one being started is announced by its own retry
                wire.send(sock, {"type": "start_episode", "episode": episode_id}, self.encoding)
                wire.receive(sock)
            else:
                ep.started = False  # local inference: the next batch carries its start
        if self.inference == "local":
            self.actor = None  # the weights of a restarted server may be older: pull them again

    def _drop(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None

    def _open(self, episode_id: str) -> _Episode:
        ep = self.episodes.get(str(episode_id))
        if ep is None or ep.end is not None:
            raise ValueError(f"episode {episode_id!r} is not open (start_episode first)")
        return ep
