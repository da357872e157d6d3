"""How A2C, A3C, PPO and IMPALA act: sample from the network's outputs with the worker's own RNG.

The network (`ActorCriticNet`) runs in torch; sampling happens here in numpy, so a worker's
exploration is its numpy RNG, saved with its state at checkpoints. The learners are in
`distrl.algos.actor_critic`.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from distrl import tree
from distrl.algos.actor_critic import action_factors
from distrl.algos.common import BoxScaler, NetworkPolicy, stored_obs
from distrl.core import Batch, Trajectory
from distrl.sampling import (Categorical, FactoredCategorical, Gaussian, categorical_act,  # noqa: F401 - tests' names
                             factored_act, gaussian_act)


class ActorCriticPolicy(NetworkPolicy):
    """Samples (explore) or takes the mode (evaluator); extras: logp, value (+ raw_action for Box). With a
    recurrent core each env has a state (kept by `Policy.infer`'s inference, local or central): a fragment
    stores the one before its first step, and a truncated episode's bootstrap value (`final_value`)."""

    def __init__(self, algo, worker_index: int, num_workers: int, seed: int):
        super().__init__(algo, worker_index, num_workers, seed)
        self.box = BoxScaler(algo.spec.action_space) if isinstance(algo.spec.action_space, spaces.Box) else None
        self.factors = action_factors(algo.spec.action_space)  # MultiDiscrete, MultiBinary: else None
        self.rule = self.sampling_rule()
        core = self.net.core
        self.state_shape = None if core is None else tuple(core.state_shape)  # (S, core_size) per env
        self.acting_method = "act_outputs" if core is None else "act_step"

    def forward(self, obs: np.ndarray, state: np.ndarray | None):
        if self.state_shape is None:
            return self.run("act_outputs", obs), None
        return self.run("act_step", obs, state)

    def initial_state(self, rows: int) -> np.ndarray | None:
        return None if self.state_shape is None else np.zeros((rows, *self.state_shape), np.float32)

    def acting_outputs(self) -> tuple[str, ...]:
        return ("out", "value") if self.box is None else ("out", "value", "log_std")

    def sampling_rule(self):
        if self.factors is not None:
            return FactoredCategorical(self.factors)
        return Categorical() if self.box is None else Gaussian(self.box)

    def acting_rule(self):
        return self.rule if self.state_shape is None else None

    def act(self, obs: np.ndarray, explore: bool):
        outputs = self.infer(obs)
        actions, extras = self.rule.act(outputs, self.rng, explore)
        if "state" in outputs:
            extras["state"] = outputs["state"]
        return actions, extras

    def postprocess(self, traj: Trajectory) -> tuple[Batch, None]:
        actions = traj.extras.get("raw_action", traj.actions)
        items = {
            "obs": stored_obs(traj.obs),
            "actions": actions,
            "rewards": traj.rewards.astype(np.float32, copy=False),
            "terminated": traj.terminated.astype(bool, copy=False),
            "truncated": traj.truncated.astype(bool, copy=False),
            "next_obs": stored_obs(traj.next_obs),
            "logp": traj.extras["logp"].astype(np.float32, copy=False),
        }
        if self.state_shape is not None:
            items["state"] = traj.extras["state"][:1].copy()  # (1, E, S, C): time-major, as fragments join
            items["final_value"] = self._final_values(traj)
        return items, None

    def _final_values(self, traj: Trajectory) -> np.ndarray:
        """(T, E) V(next_obs) after each truncated (not terminated) episode's last step, else 0."""
        out = np.zeros(traj.rewards.shape, np.float32)
        got = self.after_truncation(traj, lambda ts, es: tree.index(traj.obs, (ts, es)),
                                    lambda ts, es: tree.index(traj.next_obs, (ts, es)))
        if got is not None:
            out[got[0]] = got[1]["value"]
        return out
