"""Ape-X DQN: double DQN with a dueling head, n-step returns and prioritized replay.

Workers act epsilon-greedily with per-worker epsilons (Horgan et al., 2018:
eps_i = eps ** (1 + alpha * i / (N - 1))) and compute each transition's
initial priority |TD error| from their own Q-values; the learner trains on
importance-weighted Huber loss and returns fresh priorities. The acting half
(`DQNPolicy`) is in `distrl.algos.apex_dqn_acting`, free of torch.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from distrl.algos.common import ReplayAlgorithm, TargetNetworkState, as_tensors, mlp, skipped
from distrl.algos.sharding import ShardedLearner
from distrl.core import Batch, EnvSpec, Learner


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int, hidden: list[int], dueling: bool):
        super().__init__()
        self.torso = mlp([obs_dim, *hidden])
        self.dueling = dueling
        self.advantage = nn.Linear(hidden[-1], num_actions)
        self.value = nn.Linear(hidden[-1], 1) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.torso(obs)
        adv = self.advantage(h)
        if self.value is None:
            return adv
        return self.value(h) + adv - adv.mean(dim=1, keepdim=True)


def _build_q(spec: EnvSpec, cfg) -> QNetwork:
    obs_dim = int(np.prod(spec.observation_space.shape))
    return QNetwork(obs_dim, int(spec.action_space.n), list(cfg.hidden), cfg.dueling)


class DQNLearner(TargetNetworkState, ShardedLearner, Learner):
    def __init__(self, spec: EnvSpec, cfg, device: str):
        self.cfg, self.device = cfg, device
        self.init_networks(lambda: _build_q(spec, cfg), device)

    def trained_module(self) -> nn.Module:
        return self.q

    @torch.no_grad()
    def targets(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """r + discount * Q_target(s', a*), a* the online argmax (double DQN) or the target's."""
        q_next_target = self.target(t["next_obs"])
        if self.cfg.double:
            best = self.q(t["next_obs"]).argmax(dim=1, keepdim=True)
            q_next = q_next_target.gather(1, best).squeeze(1)
        else:
            q_next = q_next_target.max(dim=1).values
        return t["rewards"] + t["discounts"] * q_next

    def sample_loss(self, s: dict[str, torch.Tensor]):
        """Importance-weighted Huber loss of Q(s, a) against the fixed targets; per row the TD error."""
        q_taken = self.q(s["obs"]).gather(1, s["actions"].long().view(-1, 1)).squeeze(1)
        elementwise = F.huber_loss(q_taken, s["target"], reduction="none")
        weights = s.get("weights")
        loss = (elementwise * weights).mean() if weights is not None else elementwise.mean()
        return loss, {"q_mean": q_taken.detach().mean()}, {"td": (q_taken - s["target"]).detach()}

    def update(self, batch: Batch) -> dict[str, Any]:
        t = as_tensors(batch, self.device)
        rows = {"obs": t["obs"], "actions": t["actions"], "target": self.targets(t)}
        if "weights" in t:
            rows["weights"] = t["weights"]
        grad_norm, loss, terms, per_row = self.sharded_step(rows, self.optimize)
        if grad_norm is None:
            return skipped(loss)
        return {
            "loss": loss.item(),
            "q_mean": terms["q_mean"].item(),
            "grad_norm": grad_norm,
            "priorities": per_row["td"].abs().cpu().numpy(),
        }


class ApexDQN(ReplayAlgorithm):
    name = "apex_dqn"
    learner_cls = DQNLearner
    discrete, box = True, False


ALGORITHM = ApexDQN
