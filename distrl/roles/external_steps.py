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

What a connection loses when it closes is the steps of its open episodes not yet in a chunk
(`steps_lost`, `episodes_cut`): an unfinished episode's unfinished part.
"""
from __future__ import annotations

import os
import time
from collections import deque

import numpy as np

from distrl.core import Fragment, FragmentInfo, Trajectory

STEP_FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "next_obs", "versions")


class Assembler:
    """Chunks of complete steps -> (T, E) fragments postprocessed by `policy` (see the module docstring)."""

    def __init__(self, policy, fragment_length: int, columns: int, worker_index: int):
        self.policy, self.T, self.E, self.worker_index = policy, fragment_length, columns, worker_index
        self.arrays: dict[str, np.ndarray] = {}  # (E * T, ...) per field, filled column by column
        self.filled = 0
        self.ready: deque[Fragment] = deque()
        self.returns: list[float] = []   # episodes that ended since the last fragment
        self.lengths: list[int] = []
        self.fragments = 0
        self.act_s = 0.0  # the server's time acting since the last fragment (its inference time)

    def add(self, chunk: dict[str, np.ndarray], extras: dict[str, np.ndarray]) -> None:
        """k complete steps of one episode (`chunk`: STEP_FIELDS, `extras`: the policy's, each (k, ...)),
        its last one an end."""
        k, at = len(chunk["rewards"]), 0
        while at < k:
            take = min(k - at, self.E * self.T - self.filled)
            for name, values in (*chunk.items(), *(("x/" + n, v) for n, v in extras.items())):
                if name not in self.arrays:
                    self.arrays[name] = np.zeros((self.E * self.T, *values.shape[1:]), values.dtype)
                self.arrays[name][self.filled:self.filled + take] = values[at:at + take]
            self.filled += take
            at += take
            if self.filled == self.E * self.T:
                self._emit()

    def episode_ended(self, ret: float, length: int) -> None:
        self.returns.append(ret)
        self.lengths.append(length)

    def _emit(self) -> None:
        """The full (T, E) fragment, postprocessed, into `ready`."""
        T, E = self.T, self.E

        def time_major(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a.reshape(E, T, *a.shape[1:]).swapaxes(0, 1))

        a = {name: time_major(v) for name, v in self.arrays.items()}
        self.arrays, self.filled = {}, 0
        extras = {name[2:]: v for name, v in a.items() if name.startswith("x/")}
        t0 = time.time()
        data, priorities = self.policy.postprocess(Trajectory(
            a["obs"], a["actions"], a["rewards"], a["terminated"], a["truncated"], a["next_obs"], extras))
        versions = a["versions"]
        if "version" not in data:
            n = len(data["rewards"]) if "rewards" in data else 1
            data["version"] = versions if data.get("rewards", np.empty(0)).shape == (T, E) else \
                versions.reshape(-1).astype(np.int32) if n == T * E else np.full(n, versions.min(), np.int32)
        self.fragments += 1
        info = FragmentInfo(
            worker=self.worker_index, version=int(versions.min()), env_steps=T * E,
            episode_returns=np.asarray(self.returns, np.float64), episode_lengths=np.asarray(self.lengths, np.int64),
            timings={"env_s": 0.0, "inference_s": self.act_s + time.time() - t0}, pid=os.getpid(),
            items=len(data["version"]), fragment_id=(os.getpid() << 24) + self.fragments)
        self.returns, self.lengths, self.act_s = [], [], 0.0
        self.ready.append(Fragment(data, priorities, info))


class Episode:
    """An open episode: its complete steps not yet sent on, and the step waiting for its next observation."""

    def __init__(self):
        self.steps: list[tuple] = []  # (obs, action, reward, terminated, truncated, next_obs, version, extras)
        self.pending: list | None = None  # [obs, action, extras, version, reward so far]
        self.ret, self.length = 0.0, 0


class Episodes:
    """One connection's open episodes; complete steps go to the assembler in chunks of up to `chunk`."""

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
        ep = self.open[episode]
        if ep.pending is not None:
            self._complete(ep, obs, terminated=False, truncated=False)
        ep.pending = [obs, action, extras, version, 0.0]
        if len(ep.steps) >= self.chunk:
            self._send(ep)

    def reward(self, episode: str, reward: float) -> None:
        """Reward for the episode's last action (none yet: the reward before the first action is dropped)."""
        ep = self.open[episode]
        if ep.pending is not None:
            ep.pending[4] += reward

    def end(self, episode: str, obs, truncated: bool) -> None:
        ep = self.open.pop(episode)
        if ep.pending is not None:
            self._complete(ep, obs, terminated=not truncated, truncated=truncated)
        if ep.steps:
            self._send(ep)
        if ep.length:
            self.assembler.episode_ended(ep.ret, ep.length)
            self.counts["episodes"] += 1

    def close(self) -> None:
        """The connection is gone: its open episodes' steps not yet sent on are lost."""
        for ep in self.open.values():
            self.counts["steps_lost"] += len(ep.steps) + (ep.pending is not None)
            self.counts["episodes_cut"] += 1
        self.open.clear()

    def _complete(self, ep: Episode, next_obs, terminated: bool, truncated: bool) -> None:
        obs, action, extras, version, reward = ep.pending
        ep.pending = None
        ep.steps.append((obs, action, reward, terminated, truncated, next_obs, version, extras))
        ep.ret += reward
        ep.length += 1
        self.counts["steps"] += 1

    def _send(self, ep: Episode) -> None:
        """The episode's complete steps to the assembler, as a chunk whose last step is an end (its own, or
        a truncation where the chunk is cut)."""
        obs, actions, rewards, term, trunc, next_obs, versions, extras = zip(*ep.steps)
        ep.steps = []
        trunc = np.asarray(trunc, bool)
        trunc[-1] |= not term[-1]
        chunk = {"obs": np.stack(obs), "actions": np.stack(actions), "rewards": np.asarray(rewards, np.float32),
                 "terminated": np.asarray(term, bool), "truncated": trunc, "next_obs": np.stack(next_obs),
                 "versions": np.asarray(versions, np.int32)}
        self.assembler.add(chunk, {k: np.stack([e[k] for e in extras]) for k in extras[0]})
