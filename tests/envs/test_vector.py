"""The vector env: true final observations, and observations that are never non-finite (an env that
gives NaN on a step or a reset costs an episode, counted as an env error, never a poisoned replay)."""
import gymnasium as gym
import numpy as np
import pytest

from distrl.envs.vector import VectorEnv

ENV = "tests.envs.test_vector:NaNResetEnv"


class NaNResetEnv(gym.Env):
    """Episodes of 3 steps; every `bad_every`-th reset returns NaN (if > 0)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, bad_every: int = 2):
        self.bad_every, self.resets, self.t = bad_every, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets, self.t = self.resets + 1, 0
        bad = self.bad_every > 0 and self.resets % self.bad_every == 0
        return np.full(2, np.nan if bad else 0.5, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(2, 0.1 * self.t, np.float32), 1.0, self.t == 3, False, {}


def test_a_nonfinite_reset_observation_is_counted_and_the_env_reset_again():
    envs = VectorEnv(ENV, 2, seed=0, kwargs={"bad_every": 2})
    assert np.isfinite(envs.obs).all() and envs.env_errors == 0
    for _ in range(12):  # four episodes per env; each end's first reset gives NaN, the second does not
        next_obs, rewards, *_ = envs.step(np.zeros(2, np.int64))
        assert np.isfinite(envs.obs).all() and np.isfinite(next_obs).all()
    assert envs.env_errors == 2 * 4


def test_an_env_whose_reset_never_gives_a_finite_observation_fails_the_worker():
    with pytest.raises(FloatingPointError, match="non-finite"):
        VectorEnv(ENV, 1, seed=0, kwargs={"bad_every": 1})
