"""Environments for tests: faults (distrl.envs.testing:FlakyCartPole-v1) and a slow env (SlowCartPole-v1)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv


class FlakyCartPole(CartPoleEnv):
    """CartPole whose step raises RuntimeError with probability `error_prob`."""

    def __init__(self, error_prob: float = 0.001, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.error_prob = error_prob
        self._fault_rng = np.random.default_rng(seed)

    def step(self, action):
        if self._fault_rng.random() < self.error_prob:
            raise RuntimeError("FlakyCartPole: injected env failure")
        return super().step(action)


if "FlakyCartPole-v1" not in gym.envs.registry:
    gym.register("FlakyCartPole-v1", entry_point=FlakyCartPole, max_episode_steps=500, reward_threshold=475.0)


class SlowCartPole(CartPoleEnv):
    """CartPole whose step takes at least `step_s` seconds of CPU: makes a run sampling-bound on purpose."""

    def __init__(self, step_s: float = 0.002, **kwargs):
        super().__init__(**kwargs)
        self.step_s = step_s

    def step(self, action):
        import time

        end = time.perf_counter() + self.step_s
        while time.perf_counter() < end:  # busy, not sleeping: a real env's cost is CPU
            pass
        return super().step(action)


if "SlowCartPole-v1" not in gym.envs.registry:
    gym.register("SlowCartPole-v1", entry_point=SlowCartPole, max_episode_steps=500, reward_threshold=475.0)
