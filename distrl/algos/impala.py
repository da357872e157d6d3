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

from dataclasses import dataclass
from typing import Any

import torch

from distrl.algos.actor_critic import (ActorCriticAlgorithm, ActorCriticConfig, ActorCriticLearner,
                                       actor_critic_loss, cut_fraction, estimates, normalize, sample_rows, time_major)
from distrl.algos.actor_critic_acting import ActorCriticPolicy
from distrl.algos.advantages import vtrace
from distrl.algos.common import skipped
from distrl.config.fields import f
from distrl.core import Batch


@dataclass
class ImpalaConfig(ActorCriticConfig):
    rho_bar: float = f(1.0, "V-trace importance weight clip for the value target and advantages", lo=0.0, lo_open=True)
    c_bar: float = f(1.0, "V-trace trace-cutting clip", lo=0.0, lo_open=True)


class ImpalaLearner(ActorCriticLearner):
    def update(self, batch: Batch) -> dict[str, Any]:
        c = self.cfg
        t = time_major(batch, self.device)
        with torch.no_grad():  # targets over the whole batch first: the step itself may be sharded by rows
            est = estimates(self.net, t, self.recurrence)
            vs, pg_adv = vtrace(t["logp"], est.logp, t["rewards"], est.values, est.next_values,
                                t["terminated"], t["truncated"], c.gamma, c.rho_bar, c.c_bar)
            adv = normalize(pg_adv) if c.normalize_advantages else pg_adv
        rows = sample_rows(t, est, self.recurrence, adv=adv, vs=vs)
        (norm, bad), loss, terms, _ = self.sharded_step(rows, self.step)
        if not self.counted(bad):
            return skipped(loss)
        self.updates += 1
        rho = (est.logp - t["logp"]).exp()
        cut = {"sequences_cut": cut_fraction(rows)} if "first" in rows else {}
        return self.metrics(loss, terms, grad_norm=norm, optimizer_steps=self.optimizer_steps,
                            rho_mean=rho.mean(), rho_clip_frac=(rho > c.rho_bar).float().mean(), **cut)

    def sample_loss(self, s: dict[str, torch.Tensor]):
        logp, entropy, values = self.net.evaluate(s["obs"], s["actions"], s.get("state"), s.get("first"))
        loss, terms = actor_critic_loss(logp, entropy, values, s["adv"], s["vs"], self.cfg, normalized=True)
        return loss, terms, {}


class Impala(ActorCriticAlgorithm):
    name = "impala"
    external = True
    config = ImpalaConfig
    gradient_workers = True
    learner_cls, policy_cls = ImpalaLearner, ActorCriticPolicy
