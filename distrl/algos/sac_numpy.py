"""SAC's update by hand in numpy: the CPU learner's path (`SACLearner` with `use_numpy`).

Written out in numpy, this forward and backward costs the same as the autograd
update at the shipped size on a CPU, not less (bench/RESULTS.md, hot paths).
What it assumes, exactly as `distrl.algos.sac` builds it:

- Actor: a ReLU MLP torso (`mlp`, nn.Linear layers) and one Linear head whose
  output is [mean, raw]; log_std = `log_std_from_tanh(tanh(raw))`.
- Critics: `TwinQ`, both critics stacked as (2, in, out) weights and (2, 1, out)
  biases, ReLU between layers, one output; input [obs, action].
- Losses, all taken at the same parameters: critics 0.5 * sum over both
  critics of (Q - y)^2, importance-weighted, averaged; actor mean(alpha log pi -
  min Q(s, pi)) with the critics' parameters held fixed; temperature
  -log_alpha * (mean log pi + target entropy). y uses the target critics and a
  fresh policy sample at next_obs.
- Adam over one flat float32 buffer (`distrl.algos.flat`) and Polyak targets.

`tests/algos/test_sac_numpy.py` checks it against the autograd update at the
shipped size (64x64, batch 256) over many updates, and at odd shapes.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from distrl.algos.flat import FlatAdam, FlatParams
from distrl.algos.squashed_gaussian import LOG_STD_HALF_RANGE, log_std_from_tanh, numpy_softplus, tanh_log_prob
from distrl.core import Batch


def _forward(layers, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """ReLU MLP on [(W (in, out), b)] layers (TwinQ's stacked ones too): output, and every layer's input."""
    inputs = []
    for i, (w, b) in enumerate(layers):
        inputs.append(x)
        x = x @ w
        x += b
        if i < len(layers) - 1:
            np.maximum(x, 0.0, out=x)
    return x, inputs


def numpy_sac_grads(actor, critic, target, grads, batch: Batch, noise: np.ndarray, log_alpha: float,
                    target_entropy: float) -> dict[str, Any]:
    """Numeric kernel: SAC's losses and their gradients, written into `grads` (same layout as the params).

    `actor` is [(W (out, in), b)] per Linear, `critic` and `target` are [(W (2, in, out),
    b (2, 1, out))] per TwinQ layer, `grads` is {"actor": ..., "critic": ..., "log_alpha": 0-d}.
    `noise` is (2B, act_dim) standard normal: rows :B for obs, B: for next_obs.
    """
    obs, next_obs, actions = batch["obs"], batch["next_obs"], batch["actions"]
    n, act_dim = actions.shape
    alpha = math.exp(log_alpha)
    head, actor_inputs = _forward([(w.T, b) for w, b in actor], np.concatenate([obs, next_obs]))
    mean, th = head[:, :act_dim], np.tanh(head[:, act_dim:])
    log_std = log_std_from_tanh(th)
    std = np.exp(log_std)
    u = std * noise + mean
    pi = np.tanh(u)
    log_pi = tanh_log_prob(u, noise, log_std, numpy_softplus)

    q_next, _ = _forward(target, np.concatenate([next_obs, pi[n:]], axis=1))
    y = batch["rewards"] + batch["discounts"] * (np.minimum(q_next[0, :, 0], q_next[1, :, 0]) - alpha * log_pi[n:])
    # Critics on (obs, replayed action) for their loss and on (obs, policy action) for the actor's.
    q_all, critic_inputs = _forward(critic, np.concatenate(
        [np.concatenate([obs, obs]), np.concatenate([actions, pi[:n]])], axis=1))
    q, q_pi2 = q_all[:, :n, 0], q_all[:, n:, 0]
    td = q - y
    weights = batch.get("weights")
    per_sample = 0.5 * (td * td).sum(0)
    first_min = q_pi2[0] <= q_pi2[1]
    q_pi = np.where(first_min, q_pi2[0], q_pi2[1])
    log_pi_now = log_pi[:n]

    # Backward. Upstream gradient per critic row: the critic loss on the first n rows,
    # -1/n for the actor loss on the second n, only through the smaller critic.
    g = np.empty_like(q_all)
    g[:, :n, 0] = td * (weights / n if weights is not None else 1.0 / n)
    g[0, n:, 0] = np.where(first_min, -1.0 / n, 0.0)
    g[1, n:, 0] = np.where(first_min, 0.0, -1.0 / n)
    ones = np.ones((1, n), np.float32)  # bias gradients as matmuls: several times faster than sum(axis=...)
    for i in range(len(critic) - 1, -1, -1):  # param grads from rows :n, input grads from rows n:
        x, (gw, gb) = critic_inputs[i], grads["critic"][i]
        np.matmul(x[..., :n, :].swapaxes(-1, -2), g[:, :n], out=gw)
        np.matmul(ones, g[:, :n], out=gb)
        if i > 0:
            w_t = critic[i][0].swapaxes(1, 2)
            g = g * w_t if w_t.shape[1] == 1 else g @ w_t  # a 1-wide layer: an outer product, not a gemm
            g *= x > 0
    obs_dim = obs.shape[1]
    d_pi = (g[:, n:] @ critic[0][0][:, obs_dim:, :].swapaxes(1, 2)).sum(0)

    pi_now = pi[:n]
    d_u = d_pi * (1.0 - pi_now * pi_now) + (2.0 * alpha / n) * pi_now  # d log pi / du = 2 tanh(u)
    d_log_std = d_u * std[:n] * noise[:n] - alpha / n
    g = np.concatenate([d_u, d_log_std * (LOG_STD_HALF_RANGE * (1.0 - th[:n] * th[:n]))], axis=1)
    for i in range(len(actor) - 1, -1, -1):
        x, (gw, gb) = actor_inputs[i][:n], grads["actor"][i]
        np.matmul(g.T, x, out=gw)
        np.matmul(ones[0], g, out=gb)
        if i > 0:
            g = g @ actor[i][0]
            g *= x > 0
    mean_log_pi = float(log_pi_now.sum()) / n  # .sum() / n: np.mean's overhead is several times a sum's
    grads["log_alpha"][()] = -(mean_log_pi + target_entropy)
    loss_critic = float((per_sample * weights).sum() if weights is not None else per_sample.sum()) / n
    return {"loss_critic": loss_critic, "loss_actor": alpha * mean_log_pi - float(q_pi.sum()) / n,
            "loss_alpha": -log_alpha * (mean_log_pi + target_entropy), "alpha": alpha,
            "entropy": -mean_log_pi, "q_mean": float(q.sum()) / q.size, "priorities": 0.5 * np.abs(td).sum(0)}


def flush_denormals_enabled() -> bool:
    """Whether this thread flushes float denormals to zero (x86 FTZ/DAZ): a denormal product becomes 0."""
    return float(np.float32(1e-38) * np.float32(1e-3)) == 0.0


class NumpySACUpdate:
    """Binds a `SACLearner`'s parameters into flat buffers and steps them with `numpy_sac_grads` + Adam.

    The torch modules keep their parameters, re-pointed into the buffers, so
    `state_dict`, checkpoints and published weights see every update without a copy.
    """

    def __init__(self, learner):
        import torch
        from torch import nn

        self.learner = learner
        critic_params = list(learner.critic.parameters())
        learned = [*critic_params, *learner.actor.parameters(), learner.log_alpha]
        target_params = list(learner.critic_target.parameters())
        self.flat = FlatParams(learned)
        self.flat_target = FlatParams(target_params)
        self.grad_flat, grad_views = self.flat.like()
        self.adam = FlatAdam(learner.opt, self.flat, learned)
        view = {id(t): v for t, v in zip(learned, self.flat.views)}
        grad = {id(t): v for t, v in zip(learned, grad_views)}
        target = {id(t): v for t, v in zip(target_params, self.flat_target.views)}
        linears = [m for m in learner.actor.modules() if isinstance(m, nn.Linear)]

        def twin(q, views: dict) -> list:
            return [(views[id(w)], views[id(b)]) for w, b in zip(q.weights, q.biases)]
        self.params = {"actor": [(view[id(m.weight)], view[id(m.bias)]) for m in linears],
                       "critic": twin(learner.critic, view), "target": twin(learner.critic_target, target)}
        self.grads = {"actor": [(grad[id(m.weight)], grad[id(m.bias)]) for m in linears],
                      "critic": twin(learner.critic, grad), "log_alpha": grad[id(learner.log_alpha)]}
        self.log_alpha = view[id(learner.log_alpha)]
        self.critic_flat = self.flat.flat[:sum(p.numel() for p in critic_params)]  # critics come first
        self._torch = torch

    def step(self, batch: Batch, noise: np.ndarray, target_entropy: float, autotune: bool, tau: float) -> dict | None:
        """One update; None, and no change to any parameter, when a loss or gradient is not finite."""
        # Adam's moments of zero-gradient parameters (dead ReLUs) decay into the denormal
        # range, where every op is several times slower: flush them while the update runs,
        # then put the thread's mode back as it was.
        was_flushing = flush_denormals_enabled()
        self._torch.set_flush_denormal(True)
        try:
            stats = numpy_sac_grads(self.params["actor"], self.params["critic"], self.params["target"], self.grads,
                                    batch, noise, float(self.log_alpha), target_entropy)
            if not autotune:
                self.grads["log_alpha"][()] = 0.0  # Adam then leaves the temperature where it is
            if not (np.isfinite(self.grad_flat).all() and math.isfinite(stats["loss_critic"])):
                return None  # a NaN or inf here would poison every parameter Adam touches
            self.adam.step(self.grad_flat)
            target = self.flat_target.flat
            target += tau * (self.critic_flat - target)
        finally:
            self._torch.set_flush_denormal(was_flushing)
        return stats
