"""A2C: synchronous advantage actor-critic (Mnih et al., 2016, without the asynchrony).

Each update takes the whole time-major batch, computes GAE targets with the
learner's current value net (gae_lambda = 1 gives n-step returns) and takes one
optimizer step on policy gradient + value + entropy loss.
"""
from __future__ import annotations

from typing import Any

import torch

from distrl.algos.actor_critic import (ActorCriticAlgorithm, ActorCriticLearner, ActorCriticNet, GAEConfig,
                                       actor_critic_loss, bootstrap_values, time_major)
from distrl.algos.actor_critic_acting import ActorCriticPolicy
from distrl.algos.advantages import gae
from distrl.algos.common import skipped
from distrl.core import Batch


def a2c_loss(net: ActorCriticNet, t: dict[str, torch.Tensor], cfg
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The A2C loss of `net` on time-major tensors `t` (as made by `time_major`)."""
    logp, entropy, values = net.evaluate(t["obs"], t["actions"])
    adv, returns = gae(t["rewards"], values.detach().view_as(t["rewards"]), bootstrap_values(net, t),
                       t["terminated"], t["truncated"], cfg.gamma, cfg.gae_lambda)
    return actor_critic_loss(logp, entropy, values, adv.reshape(-1), returns.reshape(-1), cfg)


class A2CLearner(ActorCriticLearner):
    def update(self, batch: Batch) -> dict[str, Any]:
        loss, terms = a2c_loss(self.net, time_major(batch, self.device), self.cfg)
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
