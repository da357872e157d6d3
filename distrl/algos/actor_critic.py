"""What A2C, A3C, PPO and IMPALA share: their config keys, the network, action distributions, a
learner base and an algorithm base (the acting policy is in `distrl.algos.actor_critic_acting`).

MultiDiscrete and MultiBinary actions: a factored categorical, one categorical per factor (a MultiBinary's
elements are factors of 2 choices) from sum(nvec) logits; log-probs and entropies are sums over the factors,
so the joint log-prob is what ratios and V-trace take. Actions are stored as the env took them (its shape and
dtype, each factor from its `start`).

Box actions: the Gaussian lives in a normalised space where [-1, 1]^d maps
linearly onto the env's bounds, with a state-independent learned log-std (so one
initial std suits any action scale). The env gets the sample mapped to its units
and clipped to the bounds; the *unclipped* normalised sample is what is stored
as the action and what log-probs refer to.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.nn import functional as F

from distrl import tree
from distrl.algos.common import HALF_LOG_2PI, NetworkAlgorithm, adam, as_tensors, guarded_step, load_optimizer_state
from distrl.algos.sharding import ShardedLearner, Step
from distrl.config.fields import f
from distrl.config.sections import ModelConfig
from distrl.core import Batch, Learner
from distrl.models import make_torso
from distrl.models.masking import apply_mask
from distrl.sampling import Factors


@dataclass
class ActorCriticConfig:
    """What A2C, A3C, PPO and IMPALA share; each has its own section with its own extra keys."""

    shared_torso: bool = f(False, "policy and value heads share one torso")
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    lr: float = f(3e-4, "Adam learning rate", lo=0.0, lo_open=True)
    vf_coef: float = f(0.5, "value loss coefficient", lo=0.0)
    ent_coef: float = f(0.0, "entropy bonus coefficient", lo=0.0)
    grad_clip: float | None = f(0.5, "max global gradient norm (null = no clipping)", lo=0.0, lo_open=True)
    normalize_advantages: bool = f(True, "standardise advantages per update")


@dataclass
class GAEConfig(ActorCriticConfig):
    gae_lambda: float = f(0.95, "GAE lambda (1.0 = n-step returns)", lo=0.0, hi=1.0)



# --- action distributions ---------------------------------------------------------
def _entropy(logp_all: torch.Tensor) -> torch.Tensor:
    """-sum p log p over the last axis, 0 for a choice of probability 0 even at log p = -inf (not 0 * -inf)."""
    return -(logp_all.exp() * logp_all.clamp_min(torch.finfo(logp_all.dtype).min)).sum(-1)


class Categorical:
    def __init__(self, logits: torch.Tensor):
        self.logp_all = F.log_softmax(logits, dim=-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self.logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return _entropy(self.logp_all)


class FactoredCategorical:
    """One categorical per factor, from logits laid out factor after factor (`index`: `factor_index(nvec)`,
    `start`: each factor's first value); log-prob and entropy are sums over the factors. `logp_all`:
    (..., F, K), -inf past a factor's choices."""

    def __init__(self, logits: torch.Tensor, index: torch.Tensor, start: torch.Tensor):
        pad = logits.new_full((*logits.shape[:-1], 1), float("-inf"))
        self.logp_all = F.log_softmax(torch.cat([logits, pad], -1)[..., index], dim=-1)
        self.start = start

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Of env actions (..., *shape): flattened to (..., F) choices."""
        choices = actions.reshape(*self.logp_all.shape[:-1]).long() - self.start
        return self.logp_all.gather(-1, choices.unsqueeze(-1)).squeeze(-1).sum(-1)

    def entropy(self) -> torch.Tensor:
        return _entropy(self.logp_all).sum(-1)



class DiagGaussian:
    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean, self.log_std = mean, log_std.expand_as(mean)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) * (-self.log_std).exp()
        return -(0.5 * z.square() + self.log_std + HALF_LOG_2PI).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (self.log_std + 0.5 + HALF_LOG_2PI).sum(-1)



# --- network ----------------------------------------------------------------------
class ActorCriticNet(nn.Module):
    """obs -> (action distribution, V(obs)); separate torsos, or one shared by both heads. `factors`: a
    MultiDiscrete or MultiBinary action's (`out_dim` is then sum(nvec))."""

    def __init__(self, pi_torso: nn.Module, v_torso: nn.Module | None, out_dim: int, box: bool,
                 factors: Factors | None = None):
        super().__init__()
        self.pi_torso, self.v_torso = pi_torso, v_torso
        self.pi_head = nn.Linear(pi_torso.out_features, out_dim)
        self.v_head = nn.Linear((v_torso or pi_torso).out_features, 1)
        # A small policy head starts near-uniform (categoricals) or near-zero mean (Box).
        with torch.no_grad():
            self.pi_head.weight.mul_(0.01)
            self.pi_head.bias.zero_()
        self.log_std = nn.Parameter(torch.zeros(out_dim)) if box else None
        self.factored = factors is not None
        if factors is not None:  # not persistent: no part of the weights, only of the net's shape
            self.register_buffer("factor_index", torch.as_tensor(factors.index), persistent=False)
            self.register_buffer("factor_start", torch.as_tensor(factors.start), persistent=False)

    def _dist(self, out: torch.Tensor):
        if self.factored:
            return FactoredCategorical(out, self.factor_index, self.factor_start)
        return Categorical(out) if self.log_std is None else DiagGaussian(out, self.log_std)

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(policy head output: logits, masked where the observation has an action mask, or Gaussian mean,
        V(obs))."""
        h = self.pi_torso(obs)
        hv = h if self.v_torso is None else self.v_torso(obs)
        return apply_mask(self.pi_head(h), tree.mask_of(obs)), self.v_head(hv).squeeze(-1)

    def forward(self, obs: torch.Tensor):
        out, value = self.heads(obs)
        return self._dist(out), value

    def act_outputs(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """What acting samples from: the head's output, V(obs) and, for Box actions, the Gaussian's log-std."""
        out, value = self.heads(obs)
        if self.log_std is None:
            return {"out": out, "value": value}
        return {"out": out, "value": value, "log_std": self.log_std.expand_as(out)}

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        torso = self.pi_torso if self.v_torso is None else self.v_torso
        return self.v_head(torso(obs)).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor):
        """(log pi(a|s), entropy, V(s)) for stored actions."""
        dist, value = self(obs)
        return dist.log_prob(actions), dist.entropy(), value


# --- learning ---------------------------------------------------------------------
def time_major(batch: Batch, device: str) -> dict[str, torch.Tensor]:
    """Tensors with obs/next_obs/actions flattened to (T*B, ...); the rest stay (T, B)."""
    t = as_tensors(batch, device)
    for k in ("obs", "next_obs", "actions"):
        t[k] = tree.flatten_lead(t[k], 2)
    return t


@torch.no_grad()
def bootstrap_values(net: ActorCriticNet, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """V(next_obs) under `net`, shaped (T, B) like the rewards."""
    return net.value(t["next_obs"]).view_as(t["rewards"])


def normalize(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / (x.std(unbiased=False) + 1e-8)


def actor_critic_loss(logp: torch.Tensor, entropy: torch.Tensor, values: torch.Tensor,
                      advantages: torch.Tensor, targets: torch.Tensor, cfg, normalized: bool = False
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy gradient -A log pi + vf_coef * 0.5 (target - V)^2 - ent_coef * H (A, targets fixed);
    A is standardised here if the config asks and the caller has not (`normalized`)."""
    adv = normalize(advantages) if cfg.normalize_advantages and not normalized else advantages
    loss_policy = -(adv.detach() * logp).mean()
    loss_value = 0.5 * (targets.detach() - values).square().mean()
    ent = entropy.mean()
    loss = loss_policy + cfg.vf_coef * loss_value - cfg.ent_coef * ent
    return loss, {"loss_policy": loss_policy, "loss_value": loss_value, "entropy": ent}


class ActorCriticLearner(ShardedLearner, Learner):
    """Holds the net and optimizer; subclasses implement `update`.

    `updates` counts update() calls that took a step (one per batch); the number
    of optimizer steps is `optimizer_steps` (they differ for PPO).
    """

    def __init__(self, algo: ActorCriticAlgorithm, device: str):
        self.cfg, self.device = algo.cfg, device
        self.net = algo.build_network().to(device)
        self.opt = self.make_optimizer()
        self.updates = 0
        self.optimizer_steps = 0

    def trained_module(self) -> nn.Module:
        return self.net

    def make_optimizer(self) -> torch.optim.Optimizer:
        return adam(self.net.parameters(), self.cfg.lr, self.device)

    def step(self, loss: torch.Tensor | None = None) -> Step:
        """Backward `loss` (or use the .grad already set), clip, step: (grad norm, skipped) as tensors
        (`guarded_step`); the caller counts `optimizer_steps` once it has read them back."""
        return guarded_step(self.opt, self.net.parameters(), loss, self.cfg.grad_clip)

    def counted(self, bad: torch.Tensor) -> bool:
        """Whether the step that reported `skipped` = `bad` was taken (a read of the device: an on-policy
        update is a whole block), counted in `optimizer_steps`."""
        took = not bool(bad)
        self.optimizer_steps += took
        return took

    @staticmethod
    def metrics(loss: torch.Tensor, terms: dict[str, torch.Tensor], **extra) -> dict[str, Any]:
        """An update's scalars as floats, read from the device at once (tensors among `extra` too)."""
        tensors = {"loss": loss, **terms, **{k: v for k, v in extra.items() if torch.is_tensor(v)}}
        out = dict(zip(tensors, torch.stack([v.detach().float() for v in tensors.values()]).tolist()))
        out.update({k: v for k, v in extra.items() if not torch.is_tensor(v)})
        return out

    def weight_tensors(self) -> dict:
        return self.net.state_dict()

    def state_dict(self) -> dict[str, Any]:
        # A deep copy: a snapshot later updates can't mutate.
        return copy.deepcopy({"net": self.net.state_dict(), "opt": self.opt.state_dict(),
                              "updates": self.updates, "optimizer_steps": self.optimizer_steps})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        load_optimizer_state(self.opt, state["opt"])
        self.updates = int(state["updates"])
        self.optimizer_steps = int(state.get("optimizer_steps", 0))


def action_factors(space) -> Factors | None:
    """A MultiDiscrete or MultiBinary space's factors; None for any other space."""
    if isinstance(space, spaces.MultiBinary):
        return Factors(np.full(int(np.prod(space.shape)), 2), 0, space.shape, space.dtype)
    if isinstance(space, spaces.MultiDiscrete):
        return Factors(space.nvec, space.start, space.shape, space.dtype)
    return None


class ActorCriticAlgorithm(NetworkAlgorithm):
    """An actor-critic's declaration: Discrete, Box, MultiDiscrete or MultiBinary actions, tanh MLP torsos by
    default."""

    learner_cls: type[ActorCriticLearner] = ActorCriticLearner
    model_config = ModelConfig
    model_defaults = {"hidden": [64, 64], "activation": "tanh"}
    actions = ("discrete", "box", "multi_discrete", "multi_binary")
    structured_obs = True
    data_path = "trajectory"

    def build_network(self) -> ActorCriticNet:
        act, obs = self.spec.action_space, self.spec.observation_space
        box, factors = isinstance(act, spaces.Box), action_factors(act)
        out_dim = int(np.prod(act.shape)) if box else int(factors.nvec.sum()) if factors else int(act.n)
        pi_torso = make_torso(obs, self.model, self.image_torso)
        v_torso = None if self.cfg.shared_torso else make_torso(obs, self.model, self.image_torso)
        return ActorCriticNet(pi_torso, v_torso, out_dim, box, factors)
