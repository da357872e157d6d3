"""A wrapper for tests: every raw observation an env returns, written to a file per env, so that a test
can recompute what a run's normalization statistics must be."""
from __future__ import annotations

import os

import gymnasium as gym
import numpy as np


class RecordRawObservations(gym.Wrapper):
    """Appends each observation (resets and steps) to DIRECTORY/<pid>-<seed of the env's first reset>.txt,
    one row per line. An env first reset with seed 0 (the config check's) writes nothing."""

    def __init__(self, env: gym.Env, directory: str):
        super().__init__(env)
        self.directory, self.path = directory, None

    def _write(self, obs) -> None:
        if self.path:
            with open(self.path, "a") as fh:
                fh.write(" ".join(f"{x:.9e}" for x in np.asarray(obs, np.float32).reshape(-1)) + "\n")

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        if self.path is None and seed is not None:
            self.path = os.path.join(self.directory, f"{os.getpid()}-{seed}.txt") if seed != 0 else ""
        self._write(obs)
        return obs, info

    def step(self, action):
        out = self.env.step(action)
        self._write(out[0])
        return out


def recorded(directory: str) -> dict[str, np.ndarray]:
    """file name -> its rows (float32 as the env gave them)."""
    return {name: np.loadtxt(os.path.join(directory, name), dtype=np.float32, ndmin=2)
            for name in sorted(os.listdir(directory))}
