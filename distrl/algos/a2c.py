"""A2C: synchronous advantage actor-critic (Mnih et al., 2016, without the asynchrony).

Each update takes the whole time-major batch, computes GAE targets with the
learner's current value net (gae_lambda = 1 gives n-step returns) and takes one
optimizer step on policy gradient + value + entropy loss (with a recurrent core,
over sequences of `rollout.recurrence` steps: truncated backprop through time).
"""
from __future__ import annotations

from typing import Any

import torch

from distrl.algos.actor_critic import (ActorCriticAlgorithm, ActorCriticLearner, ActorCriticNet, GAEConfig,
                                       actor_critic_loss, cut_fraction, estimates, sample_rows, time_major)
from distrl.algos.actor_critic_acting import ActorCriticPolicy
from distrl.algos.advantages import gae
from distrl.algos.common import skipped
from distrl.core import Batch


def a2c_loss(net: ActorCriticNet, t: dict[str, torch.Tensor], cfg, recurrence: int | None = None
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The A2C loss of `net` on time-major tensors `t` (as made by `time_major`): GAE targets from the net's
    estimates without gradient, the loss over its rows (a recurrent net's sequences of `recurrence` steps)."""
    est = estimates(net, t, recurrence)
    adv, returns = gae(t["rewards"], est.values, est.next_values, t["terminated"], t["truncated"],
                       cfg.gamma, cfg.gae_lambda)
    rows = sample_rows(t, est, recurrence, adv=adv, returns=returns)
    logp, entropy, values = net.evaluate(rows["obs"], rows["actions"], rows.get("state"), rows.get("first"))
    loss, terms = actor_critic_loss(logp, entropy, values, rows["adv"], rows["returns"], cfg)
    if "first" in rows:
        terms["sequences_cut"] = cut_fraction(rows)
    return loss, terms


class A2CLearner(ActorCriticLearner):
    def update(self, batch: Batch) -> dict[str, Any]:
        loss, terms = a2c_loss(self.net, time_major(batch, self.device), self.cfg, self.recurrence)
        norm, bad = self.step(loss)
        if not self.counted(bad):
            return skipped(loss)
        self.updates += 1
        return self.metrics(loss, terms, grad_norm=norm, optimizer_steps=self.optimizer_steps)


class A2C(ActorCriticAlgorithm):
    name = "a2c"
    external = True
    config = GAEConfig
    modes = ("single", "sync")
    learner_cls, policy_cls = A2CLearner, ActorCriticPolicy
