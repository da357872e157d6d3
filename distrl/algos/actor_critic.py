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
import math
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from distrl.algos.common import (BoxScaler, adam, as_tensors, load_numpy_weights, mlp, numpy_linear,
                                 numpy_mlp, numpy_sequential, spec_problem, to_numpy_weights)
from distrl.core import Algorithm, Batch, EnvSpec, Learner, Policy, Trajectory, Weights

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


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
        return -(0.5 * z.square() + self.log_std + _HALF_LOG_2PI).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (self.log_std + 0.5 + _HALF_LOG_2PI).sum(-1)



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


# --- numpy acting (the same maths as the torch net and distributions above) ------------
def numpy_net(weights: Weights) -> dict:
    return {"pi_torso": numpy_sequential(weights, "pi_torso"),
            "v_torso": numpy_sequential(weights, "v_torso") if "v_torso.0.weight" in weights else None,
            "pi_head": numpy_linear(weights, "pi_head"), "v_head": numpy_linear(weights, "v_head"),
            "log_std": np.asarray(weights["log_std"], np.float32) if "log_std" in weights else None}


def numpy_forward(layers: dict, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(policy head output, V(obs)) of ActorCriticNet, in float32 numpy."""
    h = numpy_mlp(layers["pi_torso"], obs, np.tanh)
    hv = h if layers["v_torso"] is None else numpy_mlp(layers["v_torso"], obs, np.tanh)
    (wp, bp), (wv, bv) = layers["pi_head"], layers["v_head"]
    return h @ wp + bp, (hv @ wv + bv)[:, 0]


def categorical_act(logits: np.ndarray, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
    """Sampled (rng given) or greedy actions and their log-probs."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp_all = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    if rng is None:
        a = logp_all.argmax(axis=1)
    else:  # inverse CDF: one uniform per row
        cdf = np.exp(logp_all).cumsum(axis=1)
        a = np.minimum((cdf < rng.random((len(cdf), 1)) * cdf[:, -1:]).sum(axis=1), cdf.shape[1] - 1)
    return a, logp_all[np.arange(len(a)), a].astype(np.float32)


def gaussian_act(mean: np.ndarray, log_std: np.ndarray, rng: np.random.Generator | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Sampled (rng given) or mean actions in the normalised space, and their log-probs."""
    noise = rng.standard_normal(mean.shape).astype(np.float32) if rng is not None else np.zeros_like(mean)
    a = mean + np.exp(log_std) * noise
    logp = -(0.5 * noise * noise + log_std + _HALF_LOG_2PI).sum(axis=1)
    return a.astype(np.float32), logp.astype(np.float32)


# --- policy -----------------------------------------------------------------------
class ActorCriticPolicy(Policy):
    """Samples (explore) or takes the mode (evaluator); extras: logp, value (+ raw_action for Box).

    Acting runs the net in numpy: for a few dozen rows torch's per-op overhead
    makes it ~3x slower. `self.net` stays loaded for subclasses that need autograd (A3C).
    """

    def __init__(self, spec: EnvSpec, cfg, worker_index: int, seed: int):
        from gymnasium import spaces

        self.cfg = cfg
        self.net = build_net(spec, cfg)
        self.net.eval()
        self.box = BoxScaler(spec.action_space) if isinstance(spec.action_space, spaces.Box) else None
        self.worker_index = worker_index
        self.rng = np.random.default_rng(seed)  # saved with the worker's state at checkpoints
        self._np = numpy_net(to_numpy_weights(self.net))

    def set_weights(self, weights: Weights, version: int) -> None:
        load_numpy_weights(self.net, weights)
        self._np = numpy_net(weights)
        self.version = version

    def act(self, obs: np.ndarray, explore: bool):
        out, value = numpy_forward(self._np, np.asarray(obs, np.float32).reshape(len(obs), -1))
        if self.box is None:
            a, logp = categorical_act(out, self.rng if explore else None)
            return a, {"logp": logp, "value": value}
        a, logp = gaussian_act(out, self._np["log_std"], self.rng if explore else None)
        return self.box.to_env(a), {"logp": logp, "value": value, "raw_action": a}

    def postprocess(self, traj: Trajectory) -> tuple[Batch, None]:
        actions = traj.extras.get("raw_action", traj.actions)
        return {
            "obs": traj.obs.astype(np.float32, copy=False),
            "actions": actions,
            "rewards": traj.rewards.astype(np.float32, copy=False),
            "terminated": traj.terminated.astype(bool, copy=False),
            "truncated": traj.truncated.astype(bool, copy=False),
            "next_obs": traj.next_obs.astype(np.float32, copy=False),
            "logp": traj.extras["logp"].astype(np.float32, copy=False),
        }, None


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
                      advantages: torch.Tensor, targets: torch.Tensor, cfg
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy gradient -A log pi + vf_coef * 0.5 (target - V)^2 - ent_coef * H (A, targets fixed)."""
    adv = normalize(advantages) if cfg.normalize_advantages else advantages
    loss_policy = -(adv.detach() * logp).mean()
    loss_value = 0.5 * (targets.detach() - values).square().mean()
    ent = entropy.mean()
    loss = loss_policy + cfg.vf_coef * loss_value - cfg.ent_coef * ent
    return loss, {"loss_policy": loss_policy, "loss_value": loss_value, "entropy": ent}


class ActorCriticLearner(Learner):
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

    def make_optimizer(self) -> torch.optim.Optimizer:
        return adam(self.net.parameters(), self.cfg.lr, self.device)

    def step(self, loss: torch.Tensor | None = None) -> float:
        """Backward `loss` (or use the .grad already set), clip, step; returns the grad norm."""
        if loss is not None:
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
        norm = (nn.utils.clip_grad_norm_(self.net.parameters(), self.cfg.grad_clip, foreach=True)
                if self.cfg.grad_clip else torch.zeros(()))
        self.opt.step()
        self.optimizer_steps += 1
        return float(norm)

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
    """Config section = `cfg.<name>`; subclasses set name, learner_cls (and maybe policy_cls)."""

    policy_cls: type[ActorCriticPolicy] = ActorCriticPolicy
    learner_cls: type[ActorCriticLearner] = ActorCriticLearner

    @property
    def section(self):
        return getattr(self.cfg, self.name)

    @classmethod
    def check_spec(cls, spec: EnvSpec) -> str | None:
        return spec_problem(cls.name, spec, discrete=True, box=True)

    def make_policy(self, worker_index: int, num_workers: int) -> ActorCriticPolicy:
        return self.policy_cls(self.spec, self.section, worker_index, self.cfg.seed + 1000 + worker_index)

    def make_learner(self, device: str) -> ActorCriticLearner:
        torch.manual_seed(self.cfg.seed)
        return self.learner_cls(self.spec, self.section, device)
