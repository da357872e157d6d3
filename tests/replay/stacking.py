"""Synthetic frame envs and a rollout loop, for tests of frames stored once.

`FrameEnv` emits small uint8 frames that are unique (a global counter in their bytes) except where
it repeats the last frame (a still screen) or emits a zero frame, so coincidences between frames
are exercised too. Wrapped in gymnasium's `FrameStackObservation`, each step's stack is the one
before shifted by a frame, padded at an episode start with copies of the first frame ("reset") or
zeros ("zero"). `LeafEnv` puts such frames in a structured observation: two image leaves (one inside
a Tuple) beside a Discrete and a float leaf. `rollout` steps E such envs like a worker does and
returns the `Trajectory`: ``next_obs`` holds the true final observation at an episode end, ``obs`` of
the next step the reset one. `reloaded_alike` puts a buffer through the checkpoint file and checks the
copy holds and samples what the original does.
"""
from __future__ import annotations

import itertools
import json

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import FrameStackObservation, TimeLimit

from distrl import tree
from distrl.checkpoint.read import _join_store
from distrl.checkpoint.store_file import save_store
from distrl.core import Trajectory
from distrl.replay import ReplayBuffer
from distrl.replay.frames import FrameEncoder, frame_transitions
from distrl.replay.store import digest

_counter = itertools.count(1)


class FrameEnv(gym.Env):
    """Frames of shape `shape`; terminates with probability `p_end` per step."""

    def __init__(self, shape=(3, 4), p_end: float = 0.15, seed: int = 0):
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)
        self.action_space = spaces.Discrete(2)
        self.p_end = p_end
        self._rng = np.random.default_rng(seed)
        self._last = np.zeros(shape, np.uint8)

    def _frame(self) -> np.ndarray:
        u = self._rng.random()
        if u < 0.1:
            return self._last.copy()  # a still screen
        if u < 0.15:
            return np.zeros_like(self._last)
        frame = np.zeros(self._last.size, np.uint8)
        raw = np.frombuffer(next(_counter).to_bytes(8, "little"), np.uint8)
        frame[:min(8, frame.size)] = raw[:frame.size]
        frame[-1] = 1 + self._rng.integers(0, 255)
        self._last = frame.reshape(self._last.shape)
        return self._last.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action):
        return self._frame(), float(self._rng.normal()), bool(self._rng.random() < self.p_end), False, {}


class LeafEnv(gym.Env):
    """{image: frames of `shape`, direction: Discrete(4), views: (frames of 5x6x3, float32 pair)}; the image's
    `FrameEnv` ends the episode (with probability `p_end` per step)."""

    def __init__(self, shape=(7, 7, 3), p_end: float = 0.15, seed: int = 0):
        self.image, self.view = FrameEnv(shape, p_end, seed), FrameEnv((5, 6, 3), 0.0, seed + 1000)
        view = spaces.Tuple((self.view.observation_space, spaces.Box(-1.0, 1.0, (2,), np.float32)))
        self.observation_space = spaces.Dict({"image": self.image.observation_space,
                                              "direction": spaces.Discrete(4), "views": view})
        self.action_space = spaces.Discrete(2)
        self._rng = np.random.default_rng(seed)

    def _obs(self, image: np.ndarray, view: np.ndarray) -> dict:
        return {"image": image, "direction": np.int64(self._rng.integers(4)),
                "views": (view, self._rng.uniform(-1, 1, 2).astype(np.float32))}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(self.image.reset()[0], self.view.reset()[0]), {}

    def step(self, action):
        image, reward, terminated, _, _ = self.image.step(action)
        return self._obs(image, self.view.step(action)[0]), reward, terminated, False, {}


def make_leaf_envs(n: int, shape=(7, 7, 3), p_end: float = 0.15, max_steps: int = 9, seed: int = 0) -> list:
    """n `LeafEnv`s; TimeLimit truncates episodes at `max_steps`."""
    return [TimeLimit(LeafEnv(shape, p_end, seed=seed + i), max_steps) for i in range(n)]


def make_envs(n: int, stack: int, padding: str, shape=(3, 4), max_steps: int = 9, seed: int = 0) -> list:
    """n stacked envs; TimeLimit truncates episodes at `max_steps` (so truncations happen too)."""
    return [FrameStackObservation(TimeLimit(FrameEnv(shape, seed=seed + i), max_steps), stack, padding_type=padding)
            for i in range(n)]


class Runner:
    """Steps a list of envs with random actions, T steps per call, like a rollout worker."""

    def __init__(self, envs: list, seed: int = 0):
        self.envs = envs
        self.rng = np.random.default_rng(seed)
        self.obs = tree.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])

    def rollout(self, T: int, act=None, ended=None) -> Trajectory:
        """(T, E) steps; `act(obs) -> (actions, extras)` picks actions (random by default), `ended(done)` is
        told after each step which envs' episodes ended (a recurrent policy resets their state)."""
        E = len(self.envs)
        cols = {k: [] for k in ("obs", "actions", "rewards", "terminated", "truncated", "next_obs")}
        extras = []
        for _ in range(T):
            if act is None:
                actions, ex = self.rng.integers(0, 2, E), {}
            else:
                actions, ex = act(self.obs)
            extras.append(ex)
            step = [env.step(int(a)) for env, a in zip(self.envs, actions)]
            nxt = tree.stack([s[0] for s in step])
            term, trunc = np.array([s[2] for s in step]), np.array([s[3] for s in step])
            for k, v in (("obs", self.obs), ("actions", actions), ("rewards", [s[1] for s in step]),
                         ("terminated", term), ("truncated", trunc), ("next_obs", nxt)):
                cols[k].append(v if k in ("obs", "next_obs") else np.asarray(v))
            self.obs = tree.copy(nxt)
            for e in np.flatnonzero(term | trunc):
                tree.assign(self.obs, e, self.envs[e].reset()[0])
            if ended is not None:
                ended(term | trunc)
        arrays = {k: tree.stack(v) for k, v in cols.items()}
        arrays["rewards"] = arrays["rewards"].astype(np.float32)
        ex = {k: np.stack([x[k] for x in extras]) for k in (extras[0] if extras else {})}
        return Trajectory(**arrays, extras=ex)


def flat_transitions(encoder: FrameEncoder, traj: Trajectory, gamma: float, n: int):
    """A flat stacked observation's framed message (its column "obs"), rows and bootstrap rows."""
    return frame_transitions({"obs": encoder}, {"obs": traj.obs}, traj.actions, traj.rewards, traj.terminated,
                             traj.truncated, {"obs": traj.next_obs}, gamma, n)


def reloaded(tmp_path, buf, fresh):
    """`fresh` (an empty buffer of `buf`'s kind) loaded with `buf`'s state through the checkpoint file, no
    pickle on the way; it must then hold the same."""
    state = buf.state_dict()
    skel = json.loads(json.dumps(save_store(str(tmp_path), state)))
    with np.load(tmp_path / "store.npz", allow_pickle=False) as npz:
        fresh.load_state_dict(_join_store(skel, dict(npz), "store.npz"))
    assert digest(fresh.state_dict()) == digest(state) and fresh.bytes_per_item == buf.bytes_per_item
    return fresh


def reloaded_alike(tmp_path, buf: ReplayBuffer, message) -> tuple[dict, dict]:
    """`buf`'s state through the checkpoint file (no pickle) into a fresh buffer of its capacity and priorities,
    which must hold the same; then the same five `message()`s (msg, priorities) into both must leave the same
    contents and draw the same items. Returns both buffers' samples (2 batches of 16), the original's first."""
    fresh = reloaded(tmp_path, buf, ReplayBuffer(buf.capacity, prioritized=buf.prioritized, seed=99))
    for _ in range(5):  # the same fragments into both: identical contents, identical samples
        msg, p = message()
        buf.add(msg, p)
        fresh.add(msg, p)
    assert digest(fresh.state_dict()) == digest(buf.state_dict())
    (xa, ia, _), (xb, ib, _) = buf.sample_many(2, 16), fresh.sample_many(2, 16)
    np.testing.assert_array_equal(ia, ib)
    return xa, xb
