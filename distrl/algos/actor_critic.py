"""What A2C, A3C, PPO and IMPALA share: the network, action distributions, the
acting policy, a learner base and an algorithm base.

Box actions: the Gaussian lives in a normalised space where [-1, 1]^d maps
linearly onto the env's bounds, with a state-independent learned log-std (so one
initial std suits any action scale). The env gets the sample mapped to its units
and clipped to the bounds; the *unclipped* normalised sample is what is stored
as the action and what log-probs refer to.
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from distrl.algos.common import HALF_LOG_2PI, adam, as_tensors, guarded_step, mlp, spec_problem, to_numpy_weights
from distrl.algos.sharding import ShardedLearner
from distrl.core import Algorithm, Batch, EnvSpec, Learner, Weights



# --- action distributions ---------------------------------------------------------
class Categorical:
    def __init__(self, logits: torch.Tensor):
        self.logp_all = F.log_softmax(logits, dim=-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self.logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.logp_all.exp() * self.logp_all).sum(-1)



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
    """obs -> (action distribution, V(obs)); separate or shared tanh-MLP torsos."""

    def __init__(self, obs_dim: int, out_dim: int, hidden: list[int], shared: bool, box: bool):
        super().__init__()
        self.pi_torso = mlp([obs_dim, *hidden], activation=nn.Tanh)
        self.v_torso = None if shared else mlp([obs_dim, *hidden], activation=nn.Tanh)
        self.pi_head = nn.Linear(hidden[-1], out_dim)
        self.v_head = nn.Linear(hidden[-1], 1)
        # A small policy head starts near-uniform (Discrete) or near-zero mean (Box).
        with torch.no_grad():
            self.pi_head.weight.mul_(0.01)
            self.pi_head.bias.zero_()
        self.log_std = nn.Parameter(torch.zeros(out_dim)) if box else None

    def _dist(self, out: torch.Tensor):
        return Categorical(out) if self.log_std is None else DiagGaussian(out, self.log_std)

    def forward(self, obs: torch.Tensor):
        h = self.pi_torso(obs)
        hv = h if self.v_torso is None else self.v_torso(obs)
        return self._dist(self.pi_head(h)), self.v_head(hv).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        torso = self.pi_torso if self.v_torso is None else self.v_torso
        return self.v_head(torso(obs)).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor):
        """(log pi(a|s), entropy, V(s)) for stored actions."""
        dist, value = self(obs)
        return dist.log_prob(actions), dist.entropy(), value


def build_net(spec: EnvSpec, cfg) -> ActorCriticNet:
    from gymnasium import spaces

    act = spec.action_space
    box = isinstance(act, spaces.Box)
    out_dim = int(np.prod(act.shape)) if box else int(act.n)
    obs_dim = int(np.prod(spec.observation_space.shape))
    return ActorCriticNet(obs_dim, out_dim, list(cfg.hidden), cfg.shared_torso, box)


# --- learning ---------------------------------------------------------------------
def time_major(batch: Batch, device: str) -> dict[str, torch.Tensor]:
    """Tensors with obs/next_obs/actions flattened to (T*B, ...); the rest stay (T, B)."""
    t = as_tensors(batch, device)
    T, B = t["rewards"].shape
    for k in ("obs", "next_obs", "actions"):
        t[k] = t[k].reshape(T * B, *t[k].shape[2:])
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

    def __init__(self, spec: EnvSpec, cfg, device: str):
        self.cfg, self.device = cfg, device
        self.net = build_net(spec, cfg).to(device)
        self.opt = self.make_optimizer()
        self.updates = 0
        self.optimizer_steps = 0

    def trained_module(self) -> nn.Module:
        return self.net

    def make_optimizer(self) -> torch.optim.Optimizer:
        return adam(self.net.parameters(), self.cfg.lr, self.device)

    def step(self, loss: torch.Tensor | None = None) -> float | None:
        """Backward `loss` (or use the .grad already set), clip, step: the grad norm, or None when the
        loss or gradient was not finite and no step was taken (`guarded_step`)."""
        norm = guarded_step(self.opt, self.net.parameters(), loss, self.cfg.grad_clip)
        self.optimizer_steps += norm is not None
        return norm

    @staticmethod
    def metrics(loss: torch.Tensor, terms: dict[str, torch.Tensor], **extra: float) -> dict[str, Any]:
        out = {"loss": loss.item(), **{k: v.item() for k, v in terms.items()}}
        out.update(extra)
        return out

    def get_weights(self) -> Weights:
        return to_numpy_weights(self.net)

    def state_dict(self) -> dict[str, Any]:
        # A deep copy: a snapshot later updates can't mutate.
        return copy.deepcopy({"net": self.net.state_dict(), "opt": self.opt.state_dict(),
                              "updates": self.updates, "optimizer_steps": self.optimizer_steps})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
        self.updates = int(state["updates"])
        self.optimizer_steps = int(state.get("optimizer_steps", 0))


class ActorCriticAlgorithm(Algorithm):
    """Config section = `cfg.<name>`; subclasses set name and learner_cls (the policy is in the registry)."""

    learner_cls: type[ActorCriticLearner] = ActorCriticLearner

    @property
    def section(self):
        return getattr(self.cfg, self.name)

    @classmethod
    def check_spec(cls, spec: EnvSpec) -> str | None:
        return spec_problem(cls.name, spec, discrete=True, box=True)

    def make_learner(self, device: str) -> ActorCriticLearner:
        torch.manual_seed(self.cfg.seed)
        return self.learner_cls(self.spec, self.section, device)
