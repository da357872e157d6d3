"""How A2C, A3C, PPO and IMPALA act: sample from the network's outputs with the worker's own RNG.

The network (`ActorCriticNet`) runs in torch; sampling happens here in numpy, so a worker's
exploration is its numpy RNG, saved with its state at checkpoints. The learners are in
`distrl.algos.actor_critic`.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from distrl.algos.common import HALF_LOG_2PI, BoxScaler, NetworkPolicy, stored_obs
from distrl.core import Batch, Trajectory


def categorical_act(logits: np.ndarray, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
    """Sampled (rng given) or greedy actions and their log-probs."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp_all = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    if rng is None:
        a = logp_all.argmax(axis=1)
    else:  # inverse CDF: one uniform per row
        cdf = np.exp(logp_all).cumsum(axis=1)
        a = np.minimum((cdf < rng.random((len(cdf), 1)) * cdf[:, -1:]).sum(axis=1), cdf.shape[1] - 1)
    return a, logp_all[np.arange(len(a)), a].astype(np.float32)


def gaussian_act(mean: np.ndarray, log_std: np.ndarray, rng: np.random.Generator | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Sampled (rng given) or mean actions in the normalised space, and their log-probs."""
    noise = rng.standard_normal(mean.shape).astype(np.float32) if rng is not None else np.zeros_like(mean)
    a = mean + np.exp(log_std) * noise
    logp = -(0.5 * noise * noise + log_std + HALF_LOG_2PI).sum(axis=1)
    return a.astype(np.float32), logp.astype(np.float32)


class ActorCriticPolicy(NetworkPolicy):
    """Samples (explore) or takes the mode (evaluator); extras: logp, value (+ raw_action for Box)."""

    def __init__(self, algo, worker_index: int, num_workers: int, seed: int):
        super().__init__(algo, worker_index, num_workers, seed)
        self.box = BoxScaler(algo.spec.action_space) if isinstance(algo.spec.action_space, spaces.Box) else None

    def forward(self, obs: np.ndarray, state: None):
        return self.run("act_outputs", obs), None

    def act(self, obs: np.ndarray, explore: bool):
        net = self.infer(obs)
        out, value = net["out"], net["value"]
        if self.box is None:
            a, logp = categorical_act(out, self.rng if explore else None)
            return a, {"logp": logp, "value": value}
        a, logp = gaussian_act(out, net["log_std"], self.rng if explore else None)
        return self.box.to_env(a), {"logp": logp, "value": value, "raw_action": a}

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
