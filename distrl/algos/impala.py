"""IMPALA (Espeholt et al., 2018): actor-learner with V-trace off-policy correction.

Workers act with whatever weights they last pulled (the behaviour policy mu)
and store its log-probs. The learner recomputes log pi under its current
weights, forms V-trace targets vs and rho-clipped policy-gradient advantages
with the config's rho_bar / c_bar, and takes one optimizer step on
-rho_t A_t log pi + vf_coef * 0.5 (vs - V)^2 - ent_coef * H.

Optimizer: Adam (the paper used RMSprop); with small batches and networks
Adam is less sensitive to the learning rate and matches the rest of distrl.
"""
from __future__ import annotations

from typing import Any

from distrl.algos.actor_critic import (ActorCriticAlgorithm, ActorCriticLearner, actor_critic_loss,
                                       bootstrap_values, time_major)
from distrl.algos.advantages import vtrace
from distrl.algos.common import skipped
from distrl.core import Batch


class ImpalaLearner(ActorCriticLearner):
    def update(self, batch: Batch) -> dict[str, Any]:
        c = self.cfg
        t = time_major(batch, self.device)
        shape = t["rewards"].shape
        logp, entropy, values = self.net.evaluate(t["obs"], t["actions"])
        target_logp = logp.detach().view(shape)
        vs, pg_adv = vtrace(t["logp"], target_logp, t["rewards"], values.detach().view(shape),
                            bootstrap_values(self.net, t), t["terminated"], t["truncated"],
                            c.gamma, c.rho_bar, c.c_bar)
        loss, terms = actor_critic_loss(logp, entropy, values, pg_adv.reshape(-1), vs.reshape(-1), c)
        grad_norm = self.step(loss)
        if grad_norm is None:
            return skipped(loss)
        self.updates += 1
        rho = (target_logp - t["logp"]).exp()
        return self.metrics(loss, terms, grad_norm=grad_norm, optimizer_steps=self.optimizer_steps,
                            rho_mean=rho.mean().item(), rho_clip_frac=(rho > c.rho_bar).float().mean().item())


class Impala(ActorCriticAlgorithm):
    name = "impala"
    learner_cls = ImpalaLearner


ALGORITHM = Impala
