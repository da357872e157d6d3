"""How A2C, A3C, PPO and IMPALA act: sample from the network's outputs with the worker's own RNG.

The network (`ActorCriticNet`) runs in torch; sampling happens here in numpy, so a worker's
exploration is its numpy RNG, saved with its state at checkpoints. The learners are in
`distrl.algos.actor_critic`.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from distrl.algos.actor_critic import action_factors
from distrl.algos.common import BoxScaler, NetworkPolicy, stored_obs
from distrl.core import Batch, Trajectory
from distrl.sampling import (Categorical, FactoredCategorical, Gaussian, categorical_act,  # noqa: F401 - tests' names
                             factored_act, gaussian_act)


class ActorCriticPolicy(NetworkPolicy):
    """Samples (explore) or takes the mode (evaluator); extras: logp, value (+ raw_action for Box)."""

    def __init__(self, algo, worker_index: int, num_workers: int, seed: int):
        super().__init__(algo, worker_index, num_workers, seed)
        self.box = BoxScaler(algo.spec.action_space) if isinstance(algo.spec.action_space, spaces.Box) else None
        self.factors = action_factors(algo.spec.action_space)  # MultiDiscrete, MultiBinary: else None
        self.rule = self.acting_rule()

    acting_method = "act_outputs"

    def forward(self, obs: np.ndarray, state: None):
        return self.run("act_outputs", obs), None

    def acting_outputs(self) -> tuple[str, ...]:
        return ("out", "value") if self.box is None else ("out", "value", "log_std")

    def acting_rule(self):
        if self.factors is not None:
            return FactoredCategorical(self.factors)
        return Categorical() if self.box is None else Gaussian(self.box)

    def act(self, obs: np.ndarray, explore: bool):
        return self.rule.act(self.infer(obs), self.rng, explore)

    def postprocess(self, traj: Trajectory) -> tuple[Batch, None]:
        actions = traj.extras.get("raw_action", traj.actions)
        return {
            "obs": stored_obs(traj.obs),
            "actions": actions,
            "rewards": traj.rewards.astype(np.float32, copy=False),
            "terminated": traj.terminated.astype(bool, copy=False),
            "truncated": traj.truncated.astype(bool, copy=False),
            "next_obs": stored_obs(traj.next_obs),
            "logp": traj.extras["logp"].astype(np.float32, copy=False),
        }, None
