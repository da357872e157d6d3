"""Conservative Q-learning (Kumar et al., 2020), CQL(H), from a dataset.

Discrete actions, on the DQN learner: the double-DQN Huber TD loss plus
`conservative_weight * mean(logsumexp_a Q(s, a) - Q(s, a_data))`, which pushes every action's value
down (softly, towards the largest) and the dataset's actions up, so actions the data never took are not
overestimated. A row-wise loss: gradient workers can share a step.

Box actions, on the SAC learner: each critic's loss gains `conservative_weight * mean(LSE(s) - Q(s, a_data))`,
with log sum_a exp Q(s, a) estimated by importance sampling over `num_random` uniform actions (density
0.5^d on [-1, 1]^d) and as many of the policy's actions at s and at s' (their log-probs), all scored at s;
the samples carry no gradient. Actor and temperature learn as in SAC.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from gymnasium import spaces
from torch.nn import functional as F

from distrl import tree
from distrl.algos.apex_dqn import DQNLearner, DQNPolicy, QNetwork
from distrl.algos.common import BoxScaler, nstep_items, spec_problem
from distrl.algos.offline import OfflineAlgorithm, dataset_trajectory
from distrl.algos.sac import (SACLearner, SACPolicy, TwinQ, build_actor, build_critic, critic_space, squashed_sample,
                              vector_spec_problem)
from distrl.config.fields import f
from distrl.config.sections import ModelConfig
from distrl.core import Batch
from distrl.models import make_torso


@dataclass
class CQLConfig:
    conservative_weight: float = f(1.0, "weight of the conservative term (CQL(H)'s alpha; the paper used 5 for "
                                   "continuous control)", lo=0.0)
    num_random: int = f(10, "Box actions: actions of each kind (uniform, policy at s, policy at s') sampled per "
                        "state to estimate log sum exp Q", lo=1)
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    n_step: int = f(1, "steps in the n-step return", lo=1)
    dueling: bool = f(True, "discrete: dueling value/advantage head")
    double: bool = f(True, "discrete: double-DQN target")
    lr: float = f(1e-3, "discrete: Adam learning rate", lo=0.0, lo_open=True)
    target_update_interval: int = f(100, "discrete: updates between target-network copies", lo=1)
    grad_clip: float | None = f(10.0, "discrete: max global gradient norm (null = no clipping)", lo=0.0, lo_open=True)
    tau: float = f(0.005, "Box: Polyak factor for the target critics", lo=0.0, hi=1.0, lo_open=True)
    actor_lr: float = f(1e-4, "Box: actor Adam learning rate", lo=0.0, lo_open=True)
    critic_lr: float = f(3e-4, "Box: critic Adam learning rate", lo=0.0, lo_open=True)
    alpha_lr: float = f(1e-4, "Box: entropy-temperature Adam learning rate", lo=0.0, lo_open=True)
    init_alpha: float = f(1.0, "Box: initial entropy temperature", lo=0.0, lo_open=True)
    autotune_alpha: bool = f(True, "Box: learn the temperature towards target_entropy")
    target_entropy: float | None = f(None, "Box: entropy target (null = -dim(action space))")


class DiscreteCQLLearner(DQNLearner):
    def sample_loss(self, s: dict[str, torch.Tensor]):
        q_all = self.q(s["obs"])
        q_taken = q_all.gather(1, s["actions"].long().view(-1, 1)).squeeze(1)
        td_loss = F.huber_loss(q_taken, s["target"], reduction="none")
        gap = torch.logsumexp(q_all, dim=1) - q_taken
        loss = (td_loss + self.cfg.conservative_weight * gap).mean()
        terms = {"q_mean": q_taken.detach().mean(), "cql_gap": gap.detach().mean()}
        return loss, terms, {"td": (q_taken - s["target"]).detach()}

    def update(self, batch: Batch) -> dict[str, Any]:
        out = super().update(batch)
        out.pop("priorities", None)  # uniform replay: a dataset's items keep equal chances
        return out


class ContinuousCQLLearner(SACLearner):
    def critic_penalty(self, obs, next_obs, q: torch.Tensor):
        n, k, d = tree.rows(obs), self.cfg.num_random, self.act_dim
        with torch.no_grad():
            mean, log_std = self.actor(tree.map(lambda a, b: torch.cat([a, b]), obs, next_obs))
            on = {"device": obs.device}  # the learner's device
            pi, logp = squashed_sample(mean.expand(k, -1, -1), log_std.expand(k, -1, -1), torch.randn(k, 2 * n, d, **on))
            uniform = torch.empty(k, n, d, **on).uniform_(-1.0, 1.0)
            actions = torch.cat([uniform, pi[:, :n], pi[:, n:]])  # (3k, n, d), all scored at s
            log_density = torch.cat([torch.full((k, n), d * math.log(0.5), **on), logp[:, :n], logp[:, n:]])
        repeated = tree.map(lambda x: x.repeat(3 * k, *[1] * (x.dim() - 1)), obs)
        q_sampled = self.critic(repeated, actions.reshape(3 * k * n, d)).view(2, 3 * k, n)
        lse = torch.logsumexp(q_sampled - log_density, dim=1)  # (2, n): each critic's estimate
        gap = (lse - q).mean(dim=1)
        return self.cfg.conservative_weight * gap.sum(), {"cql_gap": gap.detach().mean()}

    def update(self, batch: Batch) -> dict[str, Any]:
        out = super().update(batch)
        out.pop("priorities", None)
        return out


class DiscreteCQLPolicy(DQNPolicy):
    """Greedy on the Q-network: an offline learner has no workers to explore for (`distrl record --epsilon`
    adds random actions)."""

    epsilon = 0.0


class ContinuousCQLPolicy(SACPolicy):
    def uniform_steps(self, num_workers: int) -> float:
        return 0


class CQL(OfflineAlgorithm):
    name = "cql"
    config = CQLConfig
    model_config = ModelConfig
    model_defaults = {"hidden": [256, 256]}
    actions = ("discrete", "box")
    gradient_workers = True  # discrete actions only: SAC's update is not sharded

    def __init__(self, spec, cfg, model, seed: int = 0, sequence=None):
        super().__init__(spec, cfg, model, seed, sequence)
        self.discrete = isinstance(spec.action_space, spaces.Discrete)
        self.gradient_workers = self.discrete
        self.learner_cls = DiscreteCQLLearner if self.discrete else ContinuousCQLLearner
        self.policy_cls = DiscreteCQLPolicy if self.discrete else ContinuousCQLPolicy

    structured_obs = True  # Discrete actions: the DQN network's multi-input torso and masks; Box: SAC's

    @classmethod
    def check_spec(cls, spec) -> str | None:
        if isinstance(spec.action_space, spaces.Box):
            return vector_spec_problem(cls.name, spec, cls.actions)
        return spec_problem(cls.name, spec, cls.actions, structured=True)

    def build_network(self):
        if self.discrete:
            torso = make_torso(self.spec.observation_space, self.model, self.image_torso)
            return QNetwork(torso, int(self.spec.action_space.n), self.cfg.dueling)
        return build_actor(self.spec, self.model)

    def build_critic(self) -> TwinQ:
        return build_critic(self.spec, self.model)

    def torso_spaces(self) -> list:
        return [self.spec.observation_space] + ([] if self.discrete else [critic_space(self.spec, self.model)])

    def dataset_items(self, steps) -> Batch:
        items, _ = nstep_items(dataset_trajectory(steps), self.cfg.gamma, self.cfg.n_step)
        if not self.discrete:
            items["actions"] = BoxScaler(self.spec.action_space).to_unit(items["actions"])
        return items
