"""Soft Actor-Critic (Haarnoja et al., 2018) for continuous (Box) action spaces.

Twin Q critics with Polyak-averaged targets, a tanh-squashed Gaussian actor and
an automatically tuned entropy temperature (log-alpha parameterisation). The
policy works in [-1, 1]^d; actions are rescaled to the env's Box bounds only at
the env boundary, and mapped back before they are stored, so the learner only
ever sees normalised actions. Workers sample from the actor's outputs with their
own RNG; the evaluator takes the mean action. SAC takes vector observations only.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.nn import functional as F

from distrl import tree
from distrl.algos.capture import GraphedStep, capturable
from distrl.algos.common import (HALF_LOG_2PI, BoxScaler, NetworkAlgorithm, NetworkPolicy, adam, as_tensors,
                                 guarded_step, load_optimizer_state, nstep_items, spec_problem, step_report)
from distrl.config.fields import f
from distrl.config.sections import ModelConfig
from distrl.core import Batch, Learner, Trajectory
from distrl.models import StackedLinear, make_ensemble, make_torso
from distrl.models.multi_input import VectorLeaves, image_leaf
from distrl.sampling import SquashedGaussian


@dataclass
class SACConfig:
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    n_step: int = f(1, "steps in the n-step critic target", lo=1)
    tau: float = f(0.005, "Polyak factor for the target critics", lo=0.0, hi=1.0, lo_open=True)
    actor_lr: float = f(3e-4, "actor Adam learning rate", lo=0.0, lo_open=True)
    critic_lr: float = f(3e-4, "critic Adam learning rate", lo=0.0, lo_open=True)
    alpha_lr: float = f(3e-4, "temperature Adam learning rate", lo=0.0, lo_open=True)
    init_alpha: float = f(1.0, "initial entropy temperature", lo=0.0, lo_open=True)
    autotune_alpha: bool = f(True, "learn the temperature towards target_entropy")
    target_entropy: float | None = f(None, "entropy target (null = -dim(action space))")
    random_steps: int = f(5000, "worker env steps with uniform random actions before the policy acts", lo=0)


# --- the math, as small pure functions (unit-tested by hand) -------------------
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def log_std_from_tanh(tanh_raw: torch.Tensor) -> torch.Tensor:
    """tanh(raw) rescaled into [LOG_STD_MIN, LOG_STD_MAX]: unlike a clamp, it keeps a gradient at the bounds."""
    return LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (tanh_raw + 1.0)


def squashed_sample(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reparameterised a = tanh(u), u = mean + std * noise, and log pi(a|s), summed over action dims.

    log N(u; mean, std) - sum log(1 - tanh(u)^2), with the correction written as
    2 * (log 2 - u - softplus(-2u)): exact, and finite for any u.
    """
    u = mean + log_std.exp() * noise
    gauss = -(0.5 * noise * noise + log_std) - HALF_LOG_2PI
    return torch.tanh(u), (gauss - 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)


def critic_target(rewards: torch.Tensor, discounts: torch.Tensor, next_q_min: torch.Tensor,
                  next_log_pi: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """Soft n-step target; `discounts` is gamma^k, or 0 where the episode terminated.

    Only the bootstrap state's entropy bonus is counted (the usual n-step SAC
    simplification: intermediate steps' log-probs are not stored).
    """
    return rewards + discounts * (next_q_min - alpha * next_log_pi)


def temperature_loss(log_alpha: torch.Tensor, log_pi: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """-(log_alpha * (log_pi + H_target)).mean(): alpha grows while entropy < H_target."""
    return -log_alpha * (log_pi.detach().mean() + target_entropy)


# --- networks -------------------------------------------------------------------
class Actor(nn.Module):
    """obs -> (mean, log_std) of the pre-tanh Gaussian; one linear layer for both heads."""

    def __init__(self, torso: nn.Module, act_dim: int):
        super().__init__()
        self.torso = torso
        self.head = nn.Linear(torso.out_features, 2 * act_dim)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw = self.head(self.torso(obs)).chunk(2, dim=-1)
        return mean, log_std_from_tanh(torch.tanh(raw))


class TwinQ(nn.Module):
    """Both critics over (obs, action): two stacked copies of the torso (one batched matmul per layer for
    an MLP) and a stacked linear head. (B, ...) -> (2, B) Q-values. `flat`: a structured observation's
    leaves as one vector (`VectorLeaves`), None for a Box one."""

    def __init__(self, torso: nn.Module, flat: nn.Module | None = None):
        super().__init__()
        self.torso, self.flat = torso, flat
        self.head = StackedLinear(2, torso.out_features, 1)

    def forward(self, obs, actions: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        """`detach_params` lets gradients reach only the inputs (the actor loss)."""
        obs = obs if self.flat is None else self.flat(obs)
        x = torch.cat([obs.flatten(1).to(actions.dtype), actions], dim=-1)
        return self.head(self.torso(x, detach_params), detach_params).squeeze(-1)


# --- learner --------------------------------------------------------------------
class SACLearner(Learner):
    graphed: GraphedStep | None = None
    def __init__(self, algo: SAC, device: str):
        cfg = self.cfg = algo.cfg
        self.device = device
        self.act_dim = int(np.prod(algo.spec.action_space.shape))
        self.actor = algo.build_network().to(device)
        self.critic, self.critic_target = algo.build_critic().to(device), algo.build_critic().to(device)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.target_entropy = float(-self.act_dim if cfg.target_entropy is None else cfg.target_entropy)
        # One optimizer with a param group each: one step() call instead of three.
        self.opt = adam([{"params": list(self.critic.parameters()), "lr": cfg.critic_lr},
                         {"params": list(self.actor.parameters()), "lr": cfg.actor_lr},
                         {"params": [self.log_alpha], "lr": cfg.alpha_lr}], cfg.critic_lr, device)
        self._params = list(self.critic.parameters())
        self._target_params = list(self.critic_target.parameters())
        self.updates = 0

    def capture_update(self) -> None:
        if capturable(self.device, True):
            self.graphed = GraphedStep(self.device_step, [self.actor, self.critic, self.critic_target], self.opt)

    def update(self, batch: Batch) -> dict[str, Any]:
        t = as_tensors(batch, self.device)
        out = self.graphed(t) if self.graphed is not None else self.device_step(t)
        self.updates += 1
        return out

    def device_step(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One gradient step on critics, actor and temperature from one backward pass.

        All three losses are taken at the same parameters, as in the paper's
        Algorithm 1, so one backward pass serves them all.
        """
        obs, next_obs, actions = t["obs"], t["next_obs"], t["actions"]
        n = tree.rows(obs)
        alpha = self.log_alpha.detach().exp()
        # One actor forward for obs (actor loss) and next_obs (target): half the launches.
        mean, log_std = self.actor(tree.map(lambda a, b: torch.cat([a, b]), obs, next_obs))
        pi, log_pi = squashed_sample(mean, log_std, torch.randn_like(mean))

        with torch.no_grad():
            q_next = self.critic_target(next_obs, pi[n:]).min(dim=0).values
            y = critic_target(t["rewards"], t["discounts"], q_next, log_pi[n:], alpha)
        q = self.critic(obs, actions)
        td = q - y
        per_sample = 0.5 * td.square().sum(0)  # the two critics' losses, summed
        weights = t.get("weights")
        loss_critic = (per_sample * weights).mean() if weights is not None else per_sample.mean()
        penalty, penalty_stats = self.critic_penalty(obs, next_obs, q)
        # The critics' params are detached here, so the actor loss trains only the actor.
        log_pi_now = log_pi[:n]
        q_pi = self.critic(obs, pi[:n], detach_params=True).min(dim=0).values
        loss_actor = (alpha * log_pi_now - q_pi).mean()
        loss_alpha = temperature_loss(self.log_alpha, log_pi_now, self.target_entropy)
        total = loss_critic + penalty + loss_actor + (loss_alpha if self.cfg.autotune_alpha else 0.0)

        # A param without a gradient (log_alpha when not autotuned) is left alone by the step.
        norm, bad = guarded_step(self.opt, [*self._params, *self.actor.parameters(), self.log_alpha], total)
        with torch.no_grad():  # a skipped step moves no target either
            torch._foreach_lerp_(self._target_params, self._params, self.cfg.tau * (~bad).float())
        return {**step_report(norm, bad, loss_critic, loss_critic=loss_critic, loss_actor=loss_actor,
                              loss_alpha=loss_alpha, alpha=alpha, entropy=-log_pi_now.mean(), q_mean=q.mean(),
                              **penalty_stats),
                "priorities": td.detach().abs().mean(0)}

    def critic_penalty(self, obs, next_obs, q: torch.Tensor):
        """A term added to the critics' loss, and its stats: none for SAC (CQL adds its conservative gap)."""
        return 0.0, {}

    def weight_tensors(self) -> dict:
        return self.actor.state_dict()

    def state_dict(self) -> dict[str, Any]:
        # A deep copy: a snapshot later updates can't mutate (torch returns live tensors).
        return copy.deepcopy({
            "actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(), "log_alpha": self.log_alpha.detach(),
            "opt": self.opt.state_dict(), "updates": self.updates})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(state["log_alpha"]))
        load_optimizer_state(self.opt, state["opt"])
        self.updates = int(state["updates"])
        if self.graphed is not None:  # the optimizer's state tensors are new ones: record again
            self.graphed.reset()


# --- policy ---------------------------------------------------------------------
class SACPolicy(NetworkPolicy):
    """Uniform random actions for its share of `random_steps`, then samples of the squashed Gaussian;
    the evaluator (index -1) takes tanh(mean)."""

    def __init__(self, algo: SAC, worker_index: int, num_workers: int, seed: int):
        super().__init__(algo, worker_index, num_workers, seed)
        self.scaler = BoxScaler(algo.spec.action_space)
        self.random_steps = self.uniform_steps(num_workers)
        self.env_steps = 0

    def uniform_steps(self, num_workers: int) -> float:
        """This worker's share of `random_steps` (the evaluator, index -1, never acts at random)."""
        return self.cfg.random_steps / max(1, num_workers) if self.worker_index >= 0 else 0

    def forward(self, obs: np.ndarray, state: None):
        mean, log_std = self.run("forward", obs)
        return {"mean": mean, "log_std": log_std}, None

    def observe_steps(self, env_steps: int) -> None:
        self.env_steps = env_steps

    def acting_outputs(self) -> tuple[str, ...]:
        return ("mean", "log_std")

    def acting_rule(self) -> SquashedGaussian:
        return SquashedGaussian(self.scaler, uniform=self.env_steps < self.random_steps)

    def act(self, obs: np.ndarray, explore: bool):
        return self.acting_rule().act(self.infer(obs), self.rng, explore)

    def postprocess(self, traj: Trajectory) -> tuple[Batch, None]:
        items, _ = nstep_items(traj, self.cfg.gamma, self.cfg.n_step)
        items["actions"] = self.scaler.to_unit(items["actions"])
        return items, None


class SAC(NetworkAlgorithm):
    name = "sac"
    external = True
    config = SACConfig
    model_config = ModelConfig
    model_defaults = {"hidden": [256, 256]}
    actions = ("box",)
    vector_only = True
    structured_obs = True  # of vector leaves: the critics take them as one vector
    learner_cls, policy_cls = SACLearner, SACPolicy

    @classmethod
    def check_spec(cls, spec) -> str | None:
        return vector_spec_problem(cls.name, spec, cls.actions)

    def build_network(self) -> Actor:
        return build_actor(self.spec, self.model)

    def build_critic(self) -> TwinQ:
        return build_critic(self.spec, self.model)

    def torso_spaces(self) -> list:
        return [self.spec.observation_space, critic_space(self.spec, self.model)]


def vector_spec_problem(name: str, spec, actions: tuple[str, ...]) -> str | None:
    """Why `name` (an actor and critics over vectors) cannot run on `spec`, or None: a flat Box observation,
    or a structured one of vector leaves."""
    problem = spec_problem(name, spec, actions, vector_only=True, structured=True)
    image = image_leaf(spec.observation_space) if tree.is_structured(spec.observation_space) else None
    if problem is None and image is not None:
        problem = (f"{name} takes vector observations only (no image torsos), the env's leaf {image!r} is "
                   f"{dict(tree.leaf_spaces(spec.observation_space))[image]}")
    return problem


def build_actor(spec, model) -> Actor:
    return Actor(make_torso(spec.observation_space, model), int(np.prod(spec.action_space.shape)))


def build_critic(spec, model) -> TwinQ:
    flat = VectorLeaves(spec.observation_space, model) if tree.is_structured(spec.observation_space) else None
    return TwinQ(make_ensemble(critic_space(spec, model), model, copies=2), flat)


def critic_space(spec, model) -> spaces.Box:
    """What the critics' torsos see: the flat observation (a structured one's leaves as one vector) and the
    normalised action, side by side."""
    obs = spec.observation_space
    width = VectorLeaves(obs, model).out_features if tree.is_structured(obs) else int(np.prod(obs.shape))
    return spaces.Box(-np.inf, np.inf, (width + int(np.prod(spec.action_space.shape)),), np.float32)
