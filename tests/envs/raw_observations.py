"""A wrapper for tests: every raw observation an env returns, written to a file per env, so that a test
can recompute what a run's normalization statistics must be."""
from __future__ import annotations

import os

import gymnasium as gym
import numpy as np


class RecordRawObservations(gym.Wrapper):
    """Appends each observation to DIRECTORY/<pid>-<seed of the env's first reset>.txt, one row per line,
    after a 0 (a reset's) or a 1 (a step's). An env first reset with seed 0 (the config check's) writes nothing."""

    def __init__(self, env: gym.Env, directory: str, leaf: str | None = None):
        """`leaf`: the key of a Dict observation whose leaf is written (None: the observation)."""
        super().__init__(env)
        self.directory, self.path, self.leaf = directory, None, leaf

    def _write(self, obs, kind: int) -> None:
        obs = obs if self.leaf is None else obs[self.leaf]
        if self.path:
            with open(self.path, "a") as fh:
                fh.write(f"{kind} " + " ".join(f"{x:.9e}" for x in np.asarray(obs, np.float32).reshape(-1)) + "\n")

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        if self.path is None and seed is not None:
            self.path = os.path.join(self.directory, f"{os.getpid()}-{seed}.txt") if seed != 0 else ""
        self._write(obs, 0)
        return obs, info

    def step(self, action):
        out = self.env.step(action)
        self._write(out[0], 1)
        return out


def recorded(directory: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """file name -> (its observations, float32 as the env gave them; whether each came from a step)."""
    out = {}
    for name in sorted(os.listdir(directory)):
        rows = np.loadtxt(os.path.join(directory, name), dtype=np.float32, ndmin=2)
        out[name] = (rows[:, 1:], rows[:, 0] == 1)
    return out


def first_steps(obs: np.ndarray, stepped: np.ndarray, steps: int) -> np.ndarray:
    """The observations an env gave up to its `steps`-th step, with the reset that step's episode end called
    (a vector env resets an env in the same call as the step that ended its episode)."""
    if steps == 0:
        return obs[:0]
    end = int(np.flatnonzero(stepped)[steps - 1]) + 1
    if end < len(obs) and not stepped[end]:
        end += 1
    return obs[:end]
