"""The roles of distrl as small interfaces, and the data that moves between them.

A run, whatever its mode, is this loop::

    policy = algo.make_policy(worker_index, num_workers)   # in each rollout worker
    learner = algo.make_learner(device)                    # exactly one, anywhere
    while not stopped:
        fragment = rollout.sample()          # worker: env steps + batched inference
        replay.add(fragment.data, fragment.priorities)
        batch = replay.sample(...)           # learner side
        metrics = learner.update(batch)      # the only optimizer.step()
        publish(learner.get_weights())       # -> parameter server -> policies

`single` runs these objects in one process; `sync` and `async` run each role as
a Ray actor (see `distrl.runtime`). Algorithms implement `Algorithm`, `Policy`
and `Learner` and never import ray.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Weights = dict[str, np.ndarray]
"""A network's parameters as numpy arrays: cheap to pickle, zero-copy in Ray's store."""

Batch = dict[str, np.ndarray]
"""Named arrays sharing a leading batch dimension."""


@dataclass
class EnvSpec:
    """What an algorithm needs to know about an environment to build its networks."""

    observation_space: Any
    action_space: Any


@dataclass
class Trajectory:
    """Time-major arrays (T, E, ...) from one worker's vector of E envs over T steps.

    `next_obs[t]` is the true next observation: on an episode end it is the
    final observation, not the one after reset. `extras` holds what the policy
    returned while acting (Q-values, log-probs, ...).
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_obs: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class FragmentInfo:
    """The small part of a fragment the driver reads: counters and episode stats."""

    worker: int
    version: int
    env_steps: int
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)
    env_errors: int = 0
    pid: int = 0  # the worker's process id: a change means the worker was restarted


@dataclass
class Fragment:
    """One worker call's experience, ready for replay: flat arrays plus priorities."""

    data: Batch
    priorities: np.ndarray | None
    info: FragmentInfo


class Policy(abc.ABC):
    """The acting half of an algorithm: lives in rollout workers and the evaluator."""

    version: int = -1

    @abc.abstractmethod
    def set_weights(self, weights: Weights, version: int) -> None:
        """Load published learner weights."""

    @abc.abstractmethod
    def act(self, obs: np.ndarray, explore: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch of observations, plus extras to keep in the trajectory."""

    def observe_steps(self, env_steps: int) -> None:
        """Told how many env steps this worker has taken (for exploration schedules)."""

    @abc.abstractmethod
    def postprocess(self, traj: Trajectory) -> tuple[Batch, np.ndarray | None]:
        """Turn a trajectory into stored items and their initial priorities (or None)."""


class Learner(abc.ABC):
    """The learning half of an algorithm: the only place optimizer.step() runs."""

    updates: int = 0

    @abc.abstractmethod
    def update(self, batch: Batch) -> dict[str, Any]:
        """One gradient update. May return 'priorities' (np.ndarray) for replay."""

    @abc.abstractmethod
    def get_weights(self) -> Weights:
        """Parameters the policies need, as numpy arrays."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume learning (networks, optimizer, counters)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""


class Algorithm(abc.ABC):
    """Factory tying an algorithm's config to its policy and learner."""

    name: str = ""
    modes: tuple[str, ...] = ("single", "sync", "async")
    """Run modes this algorithm supports."""

    def __init__(self, cfg: Any, spec: EnvSpec):
        self.cfg = cfg
        self.spec = spec

    @classmethod
    def check_spec(cls, spec: EnvSpec) -> str | None:
        """Why this algorithm can't run on `spec`, or None if it can."""
        return None

    def make_policy(self, worker_index: int, num_workers: int) -> Policy:
        """A policy for worker `worker_index` (or -1 for the evaluator): the class the registry names."""
        from distrl.algos import make_policy

        return make_policy(self.cfg, self.spec, worker_index, num_workers)

    @abc.abstractmethod
    def make_learner(self, device: str) -> Learner:
        """The learner, on `device`."""
