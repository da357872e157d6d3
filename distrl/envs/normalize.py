"""`env.normalize`: observations and rewards normalized by running statistics that every worker shares.

Each process that steps training envs (a rollout worker, single mode's driver) records the raw observations
its envs return and, for reward scaling, each env's discounted return; a fragment carries what was recorded
since the previous one as `RunningStats` (count, mean, sum of squared deviations). The learner merges them
into the one set of the run (`SharedStatistics`, exact: Chan et al.'s parallel variance) and publishes it
inside the weights (`STATISTICS_PREFIX`), so every worker, the evaluator and a saved policy
normalize with the same numbers: those the weights were trained with. The evaluator's envs use them frozen
(they record nothing). The set is part of the learner's checkpointed state.

- observations: (x - mean) / sqrt(var + 1e-8), clipped to [-clip, clip], in every env (training and
  evaluation); a structured observation's float Box leaves each by statistics of their own (part
  `obs.<leaf>`), its other leaves (pixels, codes, masks) as they are;
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

from distrl import tree
from distrl.core import Weights

STATISTICS_PREFIX = "normalize."  # published weights carry the statistics under keys starting with this
EPSILON = 1e-8
RAW_REWARD = "raw_reward"  # info key: the env's reward before scaling
RETURN_PART = "ret"  # the discounted-return statistics; the observations' are `obs_part(leaf)`


def obs_part(leaf: str) -> str:
    """The statistics part of an observation leaf (`tree.named_leaves`' name; a flat observation's is '')."""
    return f"obs.{leaf}" if leaf else "obs"


def normalized_leaves(space) -> list[str]:
    """The observation leaves env.normalize.obs normalizes: a float Box observation ('') or a structured
    one's float Box leaves (one-hot codes, pixels and masks have no running mean and scale worth learning)."""
    return [name for name, leaf in tree.leaf_spaces(space)
            if isinstance(leaf, spaces.Box) and np.issubdtype(leaf.dtype, np.floating)]


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
        names = {k[len(STATISTICS_PREFIX):-len(".count")] for k in arrays
                 if k.startswith(STATISTICS_PREFIX) and k.endswith(".count")}
        self.parts = {n: RunningStats.from_arrays(arrays, n) for n in sorted(names)}


def merged(new: list[dict[str, RunningStats] | None]) -> dict[str, RunningStats]:
    """Several fragments' new statistics as one (what the driver hands the learner)."""
    out = SharedStatistics()
    for item in new:
        out.merge(item)
    return out.parts


def check_normalizable(space) -> None:
    """TypeError unless `space` has a leaf env.normalize.obs normalizes: pixels, codes and masks alone have
    no mean and scale that would help a network."""
    if not normalized_leaves(space):
        raise TypeError(f"env.normalize.obs normalizes float Box observations or a Dict's or Tuple's float Box "
                        f"leaves, the env has none: {space} (use env.normalize.obs: false)")


class Normalization:
    """One process's view: normalizes with the shared statistics last received (`load`) and, in a training
    process, records the raw rows its envs produce until `take` hands them out as new statistics.
    `leaves`: the observation leaves it normalizes (`normalized_leaves`; set by `normalized` from the
    env's space)."""

    def __init__(self, cfg, training: bool, leaves: list[str] = ("",)):
        self.cfg, self.training = cfg, training  # cfg: the env.normalize section
        self.leaves = list(leaves)
        self.obs_stats: dict[str, tuple] = {}  # leaf -> (mean, 1 / sqrt(var + eps)) once loaded
        self.reward_scale = 1.0
        self.obs_rows: dict[str, list[np.ndarray]] = {}
        self.returns: list[float] = []
        self.loaded: dict = {}  # the statistics arrays last loaded

    def use_leaves(self, leaves: list[str]) -> None:
        """Normalize these observation leaves (the env's, known once it is built), with the statistics
        already loaded."""
        self.leaves = list(leaves)
        self.load(self.loaded)

    def load(self, weights: dict) -> None:
        """Use the shared statistics inside published weights (none there: leave them as they are)."""
        arrays = {k: v for k, v in weights.items() if k.startswith(STATISTICS_PREFIX)}
        self.loaded = arrays or self.loaded
        for leaf in self.leaves:
            obs = RunningStats.from_arrays(weights, obs_part(leaf))
            if obs is not None and obs.count > 0:
                self.obs_stats[leaf] = (obs.mean, 1.0 / np.sqrt(obs.var + EPSILON))
        ret = RunningStats.from_arrays(weights, RETURN_PART)
        if ret is not None and ret.count > 0:
            self.reward_scale = float(1.0 / np.sqrt(ret.var.reshape(-1)[0] + EPSILON))

    def observation(self, obs):
        """A raw observation an env returned, normalized (and recorded, in a training process)."""
        if self.training:
            for leaf, x in self._leaves_of(obs):
                self.obs_rows.setdefault(leaf, []).append(np.array(x, np.float64, copy=True))
        return self.normalize(obs)

    def normalize(self, obs):
        if isinstance(obs, np.ndarray) and self.leaves == [""]:
            return self._normalize_leaf("", obs)
        named = tree.named_leaves(obs)
        return tree.unflatten_like(obs, [self._normalize_leaf(n, x) if n in self.leaves else x for n, x in named])

    def _leaves_of(self, obs) -> list[tuple[str, np.ndarray]]:
        if self.leaves == [""]:
            return [("", obs)]
        return [(n, x) for n, x in tree.named_leaves(obs) if n in self.leaves]

    def _normalize_leaf(self, leaf: str, x) -> np.ndarray:
        mean, scale = self.obs_stats.get(leaf, (0.0, 1.0))
        out = (np.asarray(x, np.float64) - mean) * scale
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
        out = {obs_part(leaf): RunningStats.of(np.stack(rows)) for leaf, rows in self.obs_rows.items() if rows}
        if self.returns:
            out[RETURN_PART] = RunningStats.of(np.asarray(self.returns)[:, None])  # one column: shapes survive any file
        self.obs_rows, self.returns = {}, []
        return out or None


class SharedObservationNormalization(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Observations normalized by a `Normalization` the vector's envs share."""

    def __init__(self, env: gym.Env, normalization: Normalization):
        gym.utils.RecordConstructorArgs.__init__(self, normalization=normalization)
        gym.ObservationWrapper.__init__(self, env)
        leaves = normalized_leaves(env.observation_space)
        check_normalizable(env.observation_space)
        normalization.use_leaves(leaves)
        clip = normalization.cfg.clip if normalization.cfg.clip is not None else np.inf
        self.observation_space = _normalized_space(env.observation_space, "", leaves, clip)
        self.normalization = normalization
        self.raw = None  # the env's last observation

    def observation(self, observation):
        self.raw = observation
        return self.normalization.observation(observation)

    def renormalized(self) -> np.ndarray:
        """The last observation again, normalized with the statistics now loaded (not recorded twice)."""
        return self.normalization.normalize(self.raw)


def _normalized_space(space, name: str, leaves: list[str], clip: float):
    """`space` with its `leaves` (named as `tree.named_leaves` names them, from `name`) as float32 Boxes
    in [-clip, clip]."""
    def child(key) -> str:
        return f"{name}.{key}" if name else str(key)

    if isinstance(space, spaces.Dict):
        return spaces.Dict({k: _normalized_space(s, child(k), leaves, clip) for k, s in space.spaces.items()})
    if isinstance(space, spaces.Tuple):
        return spaces.Tuple([_normalized_space(s, child(i), leaves, clip) for i, s in enumerate(space.spaces)])
    return spaces.Box(-clip, clip, space.shape, np.float32) if name in leaves else space


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
