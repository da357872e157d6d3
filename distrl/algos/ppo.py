"""PPO (Schulman et al., 2017): clipped surrogate, optional value clipping, epochs x minibatches.

Each update() call uses its batch for `epochs` passes of `minibatches` shuffled
minibatches over the T*B samples; advantages are computed once per call with the
learner's current value net and normalised over the whole batch.

Policy lag (async mode): when any of the batch's data was produced by weights
older than the learner's (version < updates), advantages and value targets come
from V-trace with a lambda trace, rho_t = min(rho_bar, pi/mu) and
c_t = gae_lambda * min(c_bar, pi/mu), pi being the learner's current policy:
advantage_t = vs_t - V(x_t), value target vs_t. These are GAE's estimates with
each step's TD error and trace weighted by truncated importance ratios, so they
estimate the current policy's values instead of the stale behaviour's, and with
pi == mu (no lag) and rho_bar, c_bar >= 1 they equal GAE exactly; with no lag we
simply call GAE. The surrogate's ratio is always taken against the stored
behaviour log-probs, as in standard PPO, so the clip bounds the step away from
the policy that actually collected the data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from distrl import tree
from distrl.algos.actor_critic import (ActorCriticAlgorithm, ActorCriticLearner, Estimates, GAEConfig, cut_fraction,
                                       estimates, normalize, sample_rows, time_major)
from distrl.algos.actor_critic_acting import ActorCriticPolicy
from distrl.algos.advantages import gae, vtrace
from distrl.algos.common import skipped
from distrl.config.fields import f
from distrl.core import Batch


@dataclass
class PPOConfig(GAEConfig):
    clip: float = f(0.2, "surrogate ratio clip", lo=0.0, lo_open=True)
    vf_clip: float | None = f(None, "value clipping range (null = off)", lo=0.0, lo_open=True)
    epochs: int = f(4, "passes over each batch", lo=1)
    minibatches: int = f(4, "minibatches per epoch", lo=1)
    rho_bar: float = f(1.0, "async lag correction: V-trace importance weight clip", lo=0.0, lo_open=True)
    c_bar: float = f(1.0, "async lag correction: V-trace trace-cutting clip", lo=0.0, lo_open=True)


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
             entropy: torch.Tensor, cfg, live: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate + (optionally clipped) value loss - entropy bonus, with diagnostics; means over the
    rows where `live` is 1 (an agent in its episode) when given."""
    mean = torch.mean if live is None else (lambda x: (x * live).sum() / live.sum().clamp(min=1.0))
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip)
    loss_policy = -mean(torch.min(ratio * advantages, clipped * advantages))
    err = (values - returns).square()
    if cfg.vf_clip:
        # Pessimistic: the larger of the plain and the clipped-update errors.
        v_clip = old_values + (values - old_values).clamp(-cfg.vf_clip, cfg.vf_clip)
        err = torch.max(err, (v_clip - returns).square())
    loss_value = 0.5 * mean(err)
    ent = mean(entropy)
    loss = loss_policy + cfg.vf_coef * loss_value - cfg.ent_coef * ent
    with torch.no_grad():
        approx_kl = mean((ratio - 1.0) - log_ratio)  # Schulman's low-variance KL(mu||pi) estimator
        clip_frac = mean(((ratio - 1.0).abs() > cfg.clip).float())
    return loss, {"loss_policy": loss_policy, "loss_value": loss_value, "entropy": ent,
                  "approx_kl": approx_kl, "clip_frac": clip_frac}


class PPOLearner(ActorCriticLearner):
    def targets(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, Estimates, float]:
        """(advantages, returns, all (T, B), the current net's estimates, mean policy lag)."""
        c = self.cfg
        est = estimates(self.net, t, self.recurrence)
        lag = self.updates - t["version"].double() if "version" in t else torch.zeros(est.values.shape)
        if (lag != 0).any():  # data from other weights than these (older, or lost with a restored learner)
            vs, _ = vtrace(t["logp"], est.logp, t["rewards"], est.values, est.next_values,
                           t["terminated"], t["truncated"], c.gamma, c.rho_bar, c.c_bar, c.gae_lambda)
            return vs - est.values, vs, est, lag.mean().item()
        adv, returns = gae(t["rewards"], est.values, est.next_values, t["terminated"], t["truncated"],
                           c.gamma, c.gae_lambda)
        return adv, returns, est, 0.0

    def update(self, batch: Batch) -> dict[str, Any]:
        c = self.cfg
        t = time_major(batch, self.device)
        adv, returns, est, lag = self.targets(t)
        live = {"live": t["live"]} if "live" in t else {}  # multi-agent: rows of agents in their episode
        if c.normalize_advantages:
            adv = normalize(adv, *live.values())
        data = sample_rows(t, est, self.recurrence, old_logp=t["logp"], adv=adv, old_values=est.values,
                           returns=returns, **live)
        sums: torch.Tensor | None = None  # per stat, over the minibatches whose step was taken
        taken, steps = torch.zeros((), device=adv.device), 0
        for _ in range(c.epochs):  # minibatches of rows: steps, or a recurrent net's whole sequences
            for idx in torch.randperm(len(data["adv"]), device=adv.device).chunk(c.minibatches):
                rows = {k: tree.index(v, idx) for k, v in data.items()}
                (norm, bad), loss, terms, _ = self.sharded_step(rows, self.step)
                row = torch.stack([loss.detach(), *terms.values(), norm])
                row = torch.where(bad, torch.zeros_like(row), row)  # a skipped minibatch adds nothing
                sums, taken, steps = (row if sums is None else sums + row), taken + (~bad).float(), steps + 1
        n, *sums = torch.cat([taken[None], sums]).tolist()  # the update's one read of the device
        self.optimizer_steps += int(n)
        if n == 0:
            return skipped(loss)
        self.updates += 1
        out = {k: v / n for k, v in zip(["loss", *terms, "grad_norm"], sums)}
        out.update(optimizer_steps=self.optimizer_steps, policy_lag=lag, nonfinite_steps=steps - int(n))
        if "first" in data:
            out["sequences_cut"] = cut_fraction(data).item()
        return out

    def sample_loss(self, s: dict[str, torch.Tensor]):
        logp, entropy, values = self.net.evaluate(s["obs"], s["actions"], s.get("state"), s.get("first"))
        v = self.value_units
        loss, terms = ppo_loss(logp, s["old_logp"], s["adv"], v(values), v(s["old_values"]), v(s["returns"]), entropy,
                               self.cfg, s.get("live"))
        return loss, terms, {}

    def value_units(self, values: torch.Tensor) -> torch.Tensor:
        """Values (and returns) as the value loss compares them: as they are here."""
        return values


class PPO(ActorCriticAlgorithm):
    name = "ppo"
    external = True
    config = PPOConfig
    gradient_workers = True
    learner_cls, policy_cls = PPOLearner, ActorCriticPolicy
