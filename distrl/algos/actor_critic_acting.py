"""The acting half shared by A2C, PPO and IMPALA: ActorCriticNet and its
distributions in numpy, no torch (rollout workers never import it). A3C's
policy extends it with a torch copy of the network to compute gradients.

The networks, losses and learners are in `distrl.algos.actor_critic`.
"""
from __future__ import annotations


import numpy as np

from distrl.algos.common import HALF_LOG_2PI, BoxScaler, numpy_linear, numpy_mlp, numpy_sequential
from distrl.core import Batch, EnvSpec, Policy, Trajectory, Weights



# --- numpy acting (the same maths as ActorCriticNet and its distributions) -----------
def numpy_net(weights: Weights) -> dict:
    return {"pi_torso": numpy_sequential(weights, "pi_torso"),
            "v_torso": numpy_sequential(weights, "v_torso") if "v_torso.0.weight" in weights else None,
            "pi_head": numpy_linear(weights, "pi_head"), "v_head": numpy_linear(weights, "v_head"),
            "log_std": np.asarray(weights["log_std"], np.float32) if "log_std" in weights else None}


def numpy_forward(layers: dict, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(policy head output, V(obs)) of ActorCriticNet, in float32 numpy."""
    h = numpy_mlp(layers["pi_torso"], obs, np.tanh)
    hv = h if layers["v_torso"] is None else numpy_mlp(layers["v_torso"], obs, np.tanh)
    (wp, bp), (wv, bv) = layers["pi_head"], layers["v_head"]
    return h @ wp + bp, (hv @ wv + bv)[:, 0]


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


# --- policy -----------------------------------------------------------------------
class ActorCriticPolicy(Policy):
    """Samples (explore) or takes the mode (evaluator); extras: logp, value (+ raw_action for Box).

    Acting runs the net in numpy: for a few dozen rows, torch's per-op overhead
    would cost more than the arithmetic.
    """

    def __init__(self, spec: EnvSpec, cfg, worker_index: int, num_workers: int, seed: int):
        from gymnasium import spaces

        self.cfg = cfg
        self.box = BoxScaler(spec.action_space) if isinstance(spec.action_space, spaces.Box) else None
        self.worker_index = worker_index
        self.rng = np.random.default_rng(seed)  # saved with the worker's state at checkpoints
        self._np: dict | None = None  # set_weights comes before the first act (workers pull first)

    def set_weights(self, weights: Weights, version: int) -> None:
        self._np = numpy_net(weights)
        self.version = version

    def forward(self, obs: np.ndarray, state: None):
        if self._np is None:
            raise RuntimeError(f"{type(self).__name__} has no weights yet: call set_weights first")
        out, value = numpy_forward(self._np, np.asarray(obs, np.float32).reshape(len(obs), -1))
        if self.box is not None:  # the Gaussian's log-std is a weight: it travels with the outputs
            return {"out": out, "value": value, "log_std": np.broadcast_to(self._np["log_std"], out.shape)}, None
        return {"out": out, "value": value}, None

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
            "obs": traj.obs.astype(np.float32, copy=False),
            "actions": actions,
            "rewards": traj.rewards.astype(np.float32, copy=False),
            "terminated": traj.terminated.astype(bool, copy=False),
            "truncated": traj.truncated.astype(bool, copy=False),
            "next_obs": traj.next_obs.astype(np.float32, copy=False),
            "logp": traj.extras["logp"].astype(np.float32, copy=False),
        }, None
