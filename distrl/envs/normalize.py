"""`env.normalize`: observations and rewards normalized by running statistics that every worker shares.

Each process that steps training envs (a rollout worker, single mode's driver) records the raw observations
its envs return and, for reward scaling, each env's discounted return; a fragment carries what was recorded
since the previous one as `RunningStats` (count, mean, sum of squared deviations). The learner merges them
into the one set of the run (`SharedStatistics`, exact: Chan et al.'s parallel variance) and publishes it
inside the weights (`STATISTICS_PREFIX`), so every worker, the evaluator and a saved policy
normalize with the same numbers: those the weights were trained with. The evaluator's envs use them frozen
(they record nothing). The set is part of the learner's checkpointed state.

- observations: (x - mean) / sqrt(var + 1e-8), clipped to [-clip, clip], in every env (training and
  evaluation);
- rewards: r / sqrt(var(G) + 1e-8), clipped, where G is the env's discounted return so far (reset at each
  episode's end), as in gymnasium's NormalizeReward and SB3's VecNormalize; training envs only, so the
  evaluator scores the env's own rewards. The raw reward stays in the step's info (`RAW_REWARD`), from which
  a worker's episode returns are counted.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from distrl.core import Weights

STATISTICS_PREFIX = "normalize."  # published weights carry the statistics under keys starting with this
EPSILON = 1e-8
RAW_REWARD = "raw_reward"  # info key: the env's reward before scaling
PARTS = ("obs", "ret")  # observation statistics, discounted-return statistics


def network_weights(weights: Weights) -> Weights:
    """The network's own parameters of published weights (without the normalization statistics)."""
    if not any(k.startswith(STATISTICS_PREFIX) for k in weights):
        return weights
    return {k: v for k, v in weights.items() if not k.startswith(STATISTICS_PREFIX)}


class RunningStats:
    """Count, mean and sum of squared deviations (m2) of a stream of rows of one shape, merged exactly."""

    def __init__(self, count: float = 0.0, mean: Any = 0.0, m2: Any = 0.0):
        self.count = float(count)
        self.mean = np.array(mean, np.float64)
        self.m2 = np.array(m2, np.float64)

    @classmethod
    def of(cls, rows: np.ndarray) -> RunningStats:
        """The statistics of `rows` (n, *shape) in one pass."""
        rows = np.asarray(rows, np.float64)
        mean = rows.mean(0)
        return cls(len(rows), mean, np.square(rows - mean).sum(0))

    def merge(self, other: RunningStats) -> None:
        """Add `other`'s rows: Chan, Golub and LeVeque's pairwise update, exact in exact arithmetic."""
        if other.count == 0:
            return
        if self.count == 0:
            self.count, self.mean, self.m2 = other.count, other.mean.copy(), other.m2.copy()
            return
        n = self.count + other.count
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (other.count / n)
        self.m2 = self.m2 + other.m2 + np.square(delta) * (self.count * other.count / n)
        self.count = n

    @property
    def var(self) -> np.ndarray:
        """Population variance (ones before any row: normalizing then changes nothing)."""
        return self.m2 / self.count if self.count > 0 else np.ones_like(self.m2)

    def arrays(self, name: str) -> Weights:
        return {f"{STATISTICS_PREFIX}{name}.count": np.array([self.count]),
                f"{STATISTICS_PREFIX}{name}.mean": self.mean, f"{STATISTICS_PREFIX}{name}.m2": self.m2}

    @classmethod
    def from_arrays(cls, arrays: dict, name: str) -> RunningStats | None:
        key = f"{STATISTICS_PREFIX}{name}."
        if key + "count" not in arrays:
            return None
        return cls(float(np.asarray(arrays[key + "count"]).reshape(-1)[0]), arrays[key + "mean"], arrays[key + "m2"])


class SharedStatistics:
    """The run's one set of statistics (held by the learner): merges the workers' new rows, and travels as
    arrays inside the published weights and the learner's checkpoint."""

    def __init__(self):
        self.parts: dict[str, RunningStats] = {}

    def merge(self, new: dict[str, RunningStats] | None) -> None:
        for name, stats in (new or {}).items():
            self.parts.setdefault(name, RunningStats()).merge(stats)

    def arrays(self) -> Weights:
        out: Weights = {}
        for name, stats in self.parts.items():
            out.update(stats.arrays(name))
        return out

    def load(self, arrays: dict) -> None:
        self.parts = {n: s for n in PARTS if (s := RunningStats.from_arrays(arrays, n)) is not None}


def merged(new: list[dict[str, RunningStats] | None]) -> dict[str, RunningStats]:
    """Several fragments' new statistics as one (what the driver hands the learner)."""
    out = SharedStatistics()
    for item in new:
        out.merge(item)
    return out.parts


class Normalization:
    """One process's view: normalizes with the shared statistics last received (`load`) and, in a training
    process, records the raw rows its envs produce until `take` hands them out as new statistics."""

    def __init__(self, cfg, training: bool):
        self.cfg, self.training = cfg, training  # cfg: the env.normalize section
        self.obs_mean: np.ndarray | float = 0.0
        self.obs_scale: np.ndarray | float = 1.0  # 1 / sqrt(var + eps)
        self.reward_scale = 1.0
        self.obs_rows: list[np.ndarray] = []
        self.returns: list[float] = []

    def load(self, weights: dict) -> None:
        """Use the shared statistics inside published weights (none there: leave them as they are)."""
        obs, ret = RunningStats.from_arrays(weights, "obs"), RunningStats.from_arrays(weights, "ret")
        if obs is not None and obs.count > 0:
            self.obs_mean, self.obs_scale = obs.mean, 1.0 / np.sqrt(obs.var + EPSILON)
        if ret is not None and ret.count > 0:
            self.reward_scale = float(1.0 / np.sqrt(ret.var.reshape(-1)[0] + EPSILON))

    def observation(self, obs: np.ndarray) -> np.ndarray:
        """A raw observation an env returned, normalized (and recorded, in a training process)."""
        if self.training:
            self.obs_rows.append(np.array(obs, np.float64, copy=True))
        return self.normalize(obs)

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        out = (np.asarray(obs, np.float64) - self.obs_mean) * self.obs_scale
        if self.cfg.clip is not None:
            out = np.clip(out, -self.cfg.clip, self.cfg.clip)
        return out.astype(np.float32)

    def reward(self, reward: float, discounted_return: float) -> float:
        if self.training:
            self.returns.append(discounted_return)
        out = reward * self.reward_scale
        return float(np.clip(out, -self.cfg.clip, self.cfg.clip)) if self.cfg.clip is not None else float(out)

    def take(self) -> dict[str, RunningStats] | None:
        """The statistics of the rows recorded since the last take (None: nothing recorded)."""
        out = {}
        if self.obs_rows:
            out["obs"] = RunningStats.of(np.stack(self.obs_rows))
        if self.returns:
            out["ret"] = RunningStats.of(np.asarray(self.returns)[:, None])  # one column: shapes survive any file
        self.obs_rows, self.returns = [], []
        return out or None


class SharedObservationNormalization(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Observations normalized by a `Normalization` the vector's envs share."""

    def __init__(self, env: gym.Env, normalization: Normalization):
        gym.utils.RecordConstructorArgs.__init__(self, normalization=normalization)
        gym.ObservationWrapper.__init__(self, env)
        if not isinstance(env.observation_space, spaces.Box):
            raise TypeError(f"env.normalize.obs needs a Box observation space, the env has {env.observation_space}")
        clip = normalization.cfg.clip if normalization.cfg.clip is not None else np.inf
        self.observation_space = spaces.Box(-clip, clip, env.observation_space.shape, np.float32)
        self.normalization = normalization
        self.raw = None  # the env's last observation

    def observation(self, observation):
        self.raw = observation
        return self.normalization.observation(observation)

    def renormalized(self) -> np.ndarray:
        """The last observation again, normalized with the statistics now loaded (not recorded twice)."""
        return self.normalization.normalize(self.raw)


class SharedRewardScaling(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Rewards divided by the shared spread of the discounted return; the raw reward stays in the info."""

    def __init__(self, env: gym.Env, normalization: Normalization):
        gym.utils.RecordConstructorArgs.__init__(self, normalization=normalization)
        gym.Wrapper.__init__(self, env)
        self.normalization = normalization
        self.discounted_return = 0.0

    def reset(self, **kwargs):
        self.discounted_return = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.discounted_return = self.discounted_return * self.normalization.cfg.gamma + float(reward)
        scaled = self.normalization.reward(float(reward), self.discounted_return)
        if terminated or truncated:
            self.discounted_return = 0.0
        return obs, scaled, terminated, truncated, {**info, RAW_REWARD: reward}


def normalized(env: gym.Env, normalization: Normalization | None, training: bool) -> gym.Env:
    """`env` inside the normalization wrappers `normalization.cfg` asks for (reward scaling in training only)."""
    if normalization is None:
        return env
    if normalization.cfg.obs:
        env = SharedObservationNormalization(env, normalization)
    if normalization.cfg.reward and training:
        env = SharedRewardScaling(env, normalization)
    return env


def normalization_for(cfg, training: bool, weights: dict | None = None) -> Normalization | None:
    """A process's `Normalization` for an `env.normalize` section (None when it normalizes nothing), using
    the statistics inside `weights` if given."""
    if cfg is None or not (cfg.obs or cfg.reward):
        return None
    out = Normalization(cfg, training)
    out.load(weights or {})
    return out
