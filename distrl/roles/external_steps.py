"""External simulators' steps into fragments, as a rollout worker's would be.

A simulator reports an episode as events: an observation and the action taken on it, rewards, and the
episode's end. `Episodes` (one per connection) turns them into complete steps (obs, action, reward,
next obs, ends): a step is complete when the next action's observation, or the end's, arrives. An
episode's complete steps go on to the `Assembler` in chunks, when it ends or holds `chunk` steps.

The assembler lays chunks one after another into the E columns of T steps of a (T, E) fragment (T =
rollout.fragment_length, E = env.num_envs), column after column, so a column holds consecutive steps
of one episode, then of another. Every chunk's last step is an end: the episode's own, or a
truncation where the chunk was cut, with the true next observation to bootstrap from. So n-step
windows, GAE and V-trace never cross from one episode into another, and no value target is biased by
the cut. A full fragment is postprocessed by the run's policy, as a worker's is, and waits for the
driver in `ready`.

A recurrent policy's chunks go to `external_lanes.Lanes` instead, which cuts no chunk: an episode's steps
lie in columns of their own, each storing the state before its first step.

Observations are trees of arrays (`distrl.tree`: a structured one's leaves, a flat one's one array), kept
and cut leaf by leaf as a rollout worker's are.

What a connection loses when it closes is the steps of its open episodes not yet in a chunk
(`steps_lost`, `episodes_cut`): an unfinished episode's unfinished part.
"""
from __future__ import annotations

import os
import time
from collections import deque

import numpy as np

from distrl import tree
from distrl.core import Fragment, FragmentInfo, Trajectory
from distrl.observe.trace import tracer


class Assembler:
    """Chunks of complete steps -> (T, E) fragments postprocessed by `policy` (see the module docstring)."""

    cuts = True  # every chunk's last step is an end (a cut one a truncation): `Episodes._send`

    def __init__(self, policy, fragment_length: int, columns: int, worker_index: int):
        self.policy, self.T, self.E, self.worker_index = policy, fragment_length, columns, worker_index
        self.arrays: dict[str, np.ndarray] = {}  # (E * T, ...) per field, filled column by column
        self.filled = 0
        self.ready: deque[Fragment] = deque()
        self.returns: list[float] = []   # episodes that ended since the last fragment
        self.lengths: list[int] = []
        self.fragments = 0
        self.act_s = 0.0  # the server's time acting since the last fragment (its inference time)

    def add(self, rows: dict[str, np.ndarray], owner: Episode) -> None:
        """k complete steps of one episode (`rows`: a step's fields, obs, actions, rewards,
        terminated, truncated, next_obs and versions, and the policy's extras as "x/<extra>", each
        (k, ...)), its last one an end. `owner`: the episode (`external_lanes.Lanes` keeps its column there)."""
        k, at = len(rows["rewards"]), 0
        while at < k:
            take = min(k - at, self.E * self.T - self.filled)
            put(self.arrays, self.E * self.T, self.filled, rows, at, take)
            self.filled += take
            at += take
            if self.filled == self.E * self.T:
                self._emit()

    def cut(self, owner) -> None:
        """`owner`'s connection closed with it open: nothing to do here (each chunk it sent ended)."""

    def episode_ended(self, ret: float, length: int) -> None:
        self.returns.append(ret)
        self.lengths.append(length)

    def _emit(self) -> None:
        """The full (T, E) fragment, postprocessed, into `ready`."""
        T, E = self.T, self.E

        def time_major(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a.reshape(E, T, *a.shape[1:]).swapaxes(0, 1))

        a = {name: tree.map(time_major, v) for name, v in self.arrays.items()}
        self.arrays, self.filled = {}, 0
        extras = {name[2:]: v for name, v in a.items() if name.startswith("x/")}
        t0 = time.time()
        self.fragments += 1
        fragment_id = (os.getpid() << 24) + self.fragments  # names its transfer to the replay server in traces
        with tracer().span("postprocess", "rollout", env_steps=T * E):
            data, priorities = self.policy.postprocess(Trajectory(
                a["obs"], a["actions"], a["rewards"], a["terminated"], a["truncated"], a["next_obs"], extras))
            tracer().flow_out("fragment", fragment_id)
        versions = a["versions"]
        if "version" not in data:
            n = len(data["rewards"]) if "rewards" in data else 1
            data["version"] = versions if data.get("rewards", np.empty(0)).shape == (T, E) else \
                versions.reshape(-1).astype(np.int32) if n == T * E else np.full(n, versions.min(), np.int32)
        info = FragmentInfo(
            worker=self.worker_index, version=int(versions.min()), env_steps=T * E,
            episode_returns=np.asarray(self.returns, np.float64), episode_lengths=np.asarray(self.lengths, np.int64),
            timings={"env_s": 0.0, "inference_s": self.act_s + time.time() - t0}, pid=os.getpid(),
            items=len(data["version"]), fragment_id=fragment_id)
        self.returns, self.lengths, self.act_s = [], [], 0.0
        self.ready.append(Fragment(data, priorities, info))


def put(arrays: dict, size: int, dst: int, rows: dict, src: int, k: int) -> None:
    """Rows src..src+k of each field of `rows` into `arrays` (each field `size` rows, allocated when first
    put) at dst..dst+k."""
    for name, values in rows.items():
        if name not in arrays:
            arrays[name] = tree.empty((size,), tree.index(values, 0))
        tree.assign(arrays[name], slice(dst, dst + k), tree.index(values, slice(src, src + k)))


class Episode:
    """An open episode: its complete steps not yet sent on (blocks of rows), and the step waiting for its
    next observation (one row, and its reward so far)."""

    def __init__(self):
        self.blocks: list[dict[str, np.ndarray]] = []  # a step's fields and "x/<extra>", k rows each
        self.held = 0  # complete steps in `blocks`
        self.pending: dict[str, np.ndarray] | None = None  # obs, actions, versions, "x/<extra>": one row each
        self.pending_reward = 0.0
        self.ret, self.length = 0.0, 0
        self.state = None  # a recurrent policy's state before the episode's next action (remote inference)
        self.column = None  # a recurrent policy's: the column its steps go on in (`external_lanes.Lanes`)


class Episodes:
    """One connection's open episodes; complete steps go to the assembler in chunks of at least `chunk`
    (or an episode's last ones)."""

    def __init__(self, assembler: Assembler, chunk: int, max_open: int, counts: dict[str, int]):
        """`counts`: the server's running counts, which this adds its steps, episodes and losses to."""
        self.assembler, self.chunk, self.max_open, self.counts = assembler, chunk, max_open, counts
        self.open: dict[str, Episode] = {}

    def start(self, episode: str) -> str | None:
        """Open `episode`; why not, or None."""
        if episode in self.open:
            return f"episode {episode!r} is already open"
        if len(self.open) >= self.max_open:
            return f"{self.max_open} episodes are open on this connection, the most it may hold"
        self.open[episode] = Episode()
        return None

    def act(self, episode: str, obs, action, extras: dict, version: int) -> None:
        """The action taken on `obs` (which completes the episode's previous step)."""
        self.extend(episode, _one_row(obs), np.asarray(action)[None],
                    {k: np.asarray(v)[None] for k, v in extras.items()}, np.array([version]), np.zeros(1))

    def extend(self, episode: str, obs: tree.Tree, actions: np.ndarray, extras: dict, versions: np.ndarray,
               rewards: np.ndarray) -> None:
        """k actions taken one after another on `obs` (k rows each), each but the last with its reward final
        (`rewards`); the first completes the episode's previous step, the last waits for its next observation."""
        ep, k = self.open[episode], len(rewards)
        if k == 0:
            return
        if ep.pending is not None:
            self._complete(ep, tree.index(obs, slice(None, 1)), terminated=False, truncated=False)
        if k > 1:
            done = np.zeros(k - 1, bool)
            self._hold(ep, {"obs": tree.index(obs, slice(None, -1)), "actions": actions[:-1],
                            "rewards": rewards[:-1].astype(np.float32), "terminated": done, "truncated": done,
                            "next_obs": tree.index(obs, slice(1, None)), "versions": versions[:-1],
                            **{"x/" + n: v[:-1] for n, v in extras.items()}})
        ep.pending = {"obs": tree.index(obs, slice(-1, None)), "actions": actions[-1:], "versions": versions[-1:],
                      **{"x/" + n: v[-1:] for n, v in extras.items()}}
        ep.pending_reward = float(rewards[-1])
        if ep.held >= self.chunk:
            self._send(ep)

    def reward(self, episode: str, reward: float) -> None:
        """Reward for the episode's last action (none yet: the reward before the first action is dropped)."""
        ep = self.open[episode]
        if ep.pending is not None:
            ep.pending_reward += reward

    def end(self, episode: str, obs, truncated: bool) -> None:
        ep = self.open.pop(episode)
        if ep.pending is not None:
            self._complete(ep, _one_row(obs), terminated=not truncated, truncated=truncated)
        if ep.held:
            self._send(ep)
        if ep.length:
            self.assembler.episode_ended(ep.ret, ep.length)
            self.counts["episodes"] += 1

    def close(self) -> None:
        """The connection is gone: its open episodes' steps not yet sent on are lost."""
        for ep in self.open.values():
            self.counts["steps_lost"] += ep.held + (ep.pending is not None)
            self.counts["episodes_cut"] += 1
            self.assembler.cut(ep)
        self.open.clear()

    def _complete(self, ep: Episode, next_obs: tree.Tree, terminated: bool, truncated: bool) -> None:
        row, ep.pending = ep.pending, None
        self._hold(ep, {**row, "rewards": np.array([ep.pending_reward], np.float32), "next_obs": next_obs,
                        "terminated": np.array([terminated]), "truncated": np.array([truncated])})

    def _hold(self, ep: Episode, block: dict[str, np.ndarray]) -> None:
        k = len(block["rewards"])
        ep.blocks.append(block)
        ep.held += k
        ep.ret += float(block["rewards"].sum())
        ep.length += k
        self.counts["steps"] += k

    def _send(self, ep: Episode) -> None:
        """The episode's complete steps to the assembler, as a chunk whose last step is an end (its own, or
        a truncation where the chunk is cut; a recurrent policy's `Lanes` cut no chunk)."""
        blocks, ep.blocks, ep.held = ep.blocks, [], 0
        chunk = {name: tree.concatenate([b[name] for b in blocks]) for name in blocks[0]}
        if self.assembler.cuts:
            chunk["truncated"] = chunk["truncated"].copy()
            chunk["truncated"][-1] |= not chunk["terminated"][-1]
        chunk["versions"] = chunk["versions"].astype(np.int32)
        self.assembler.add(chunk, ep)


def _one_row(obs: tree.Tree) -> tree.Tree:
    """One observation as a batch of one row (a structured one leaf by leaf)."""
    return tree.map(lambda x: np.asarray(x)[None], obs)
