"""Soft Actor-Critic (Haarnoja et al., 2018) for continuous (Box) action spaces.

Twin Q critics with Polyak-averaged targets, a tanh-squashed Gaussian actor and
an automatically tuned entropy temperature (log-alpha parameterisation). The
policy works in [-1, 1]^d; actions are rescaled to the env's Box bounds only at
the env boundary, and mapped back before they are stored, so the learner only
ever sees normalised actions. The acting half (`SACPolicy`) is in
`distrl.algos.sac_acting`, free of torch.
"""
from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from distrl.algos.common import ReplayAlgorithm, adam, as_tensors, guarded_step, mlp, skipped, to_numpy_weights
from distrl.algos.sac_acting import spec_dims
from distrl.algos.sac_numpy import NumpySACUpdate
from distrl.algos.squashed_gaussian import log_std_from_tanh, tanh_log_prob
from distrl.core import Batch, EnvSpec, Learner, Weights


# --- the math, as small pure functions (unit-tested by hand) -------------------
def squashed_sample(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reparameterised a = tanh(mean + std * noise) and log pi(a|s), summed over action dims."""
    u = mean + log_std.exp() * noise
    return torch.tanh(u), tanh_log_prob(u, noise, log_std, F.softplus)


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

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int]):
        super().__init__()
        self.torso = mlp([obs_dim, *hidden])
        self.head = nn.Linear(hidden[-1], 2 * act_dim)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw = self.head(self.torso(obs)).chunk(2, dim=-1)
        return mean, log_std_from_tanh(torch.tanh(raw))


class TwinQ(nn.Module):
    """Both critics in one stacked MLP: each layer is one batched matmul over (2, B, width).

    Half the kernel launches of two separate MLPs, which is what a small update on a CPU
    pays for. Init matches nn.Linear's default.
    """

    def __init__(self, in_dim: int, hidden: list[int]):
        super().__init__()
        sizes = [in_dim, *hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(2, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(2, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        """(2, B) Q-values; `detach_params` lets gradients reach only the inputs (actor loss)."""
        x = torch.cat([obs, actions], dim=-1).expand(2, -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if detach_params:
                w, b = w.detach(), b.detach()
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = F.relu(x)
        return x.squeeze(-1)


# --- learner --------------------------------------------------------------------
class SACLearner(Learner):
    """`use_numpy` (default: on a CPU) runs the update by hand in numpy (`distrl.algos.sac_numpy`):
    at these sizes autograd's per-op overhead dominates. The autograd update serves GPUs
    and is the reference the numpy one is tested against."""

    def __init__(self, spec: EnvSpec, cfg, device: str, use_numpy: bool | None = None):
        self.cfg, self.device = cfg, device
        obs_dim, act_dim = spec_dims(spec)
        hidden = list(cfg.hidden)
        self.actor = Actor(obs_dim, act_dim, hidden).to(device)
        self.critic = TwinQ(obs_dim + act_dim, hidden).to(device)
        self.critic_target = TwinQ(obs_dim + act_dim, hidden).to(device)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.target_entropy = float(-act_dim if cfg.target_entropy is None else cfg.target_entropy)
        # One optimizer with a param group each: one step() call instead of three.
        self.opt = adam([{"params": list(self.critic.parameters()), "lr": cfg.critic_lr},
                         {"params": list(self.actor.parameters()), "lr": cfg.actor_lr},
                         {"params": [self.log_alpha], "lr": cfg.alpha_lr}], cfg.critic_lr, device)
        self._params = list(self.critic.parameters())
        self._target_params = list(self.critic_target.parameters())
        self.act_dim = act_dim
        self.updates = 0
        if use_numpy is None:
            use_numpy = torch.device(device).type == "cpu"
        self.numpy_update = NumpySACUpdate(self) if use_numpy else None

    def update(self, batch: Batch) -> dict[str, Any]:
        if self.numpy_update is None:
            return self._torch_update(batch)
        n = len(batch["obs"])
        noise = torch.randn(2 * n, self.act_dim).numpy()  # torch's generator: seeded and checkpointed
        b = {k: np.asarray(batch[k], np.float32) for k in ("obs", "next_obs", "actions", "rewards", "discounts")}
        if batch.get("weights") is not None:
            b["weights"] = np.asarray(batch["weights"], np.float32)
        stats = self.numpy_update.step(b, noise, self.target_entropy, self.cfg.autotune_alpha, self.cfg.tau)
        if stats is None:
            return {"nonfinite": 1, "loss": math.nan}
        self.updates += 1
        return {"loss": stats["loss_critic"], **stats}

    def _torch_update(self, batch: Batch) -> dict[str, Any]:
        """One gradient step on critics, actor and temperature from one backward pass.

        All three losses are taken at the same parameters, as in the paper's
        Algorithm 1, so one backward pass serves them all.
        """
        t = as_tensors(batch, self.device)
        obs, next_obs, actions = t["obs"], t["next_obs"], t["actions"]
        n = obs.shape[0]
        alpha = self.log_alpha.detach().exp()
        # One actor forward for obs (actor loss) and next_obs (target): half the launches.
        mean, log_std = self.actor(torch.cat([obs, next_obs]))
        pi, log_pi = squashed_sample(mean, log_std, torch.randn_like(mean))

        with torch.no_grad():
            q_next = self.critic_target(next_obs, pi[n:]).min(dim=0).values
            y = critic_target(t["rewards"], t["discounts"], q_next, log_pi[n:], alpha)
        q = self.critic(obs, actions)
        td = q - y
        per_sample = 0.5 * td.square().sum(0)  # the two critics' losses, summed
        weights = t.get("weights")
        loss_critic = (per_sample * weights).mean() if weights is not None else per_sample.mean()
        # The critics' params are detached here, so the actor loss trains only the actor.
        log_pi_now = log_pi[:n]
        q_pi = self.critic(obs, pi[:n], detach_params=True).min(dim=0).values
        loss_actor = (alpha * log_pi_now - q_pi).mean()
        loss_alpha = temperature_loss(self.log_alpha, log_pi_now, self.target_entropy)
        total = loss_critic + loss_actor + (loss_alpha if self.cfg.autotune_alpha else 0.0)

        # A param without a gradient (log_alpha when not autotuned) is left alone by the step.
        if guarded_step(self.opt, [*self._params, *self.actor.parameters(), self.log_alpha], total) is None:
            return skipped(total)

        with torch.no_grad():
            torch._foreach_lerp_(self._target_params, self._params, self.cfg.tau)
            stats = torch.stack([loss_critic, loss_actor, loss_alpha, alpha,
                                 -log_pi_now.mean(), q.mean()]).tolist()
            priorities = td.abs().mean(0).cpu().numpy()
        self.updates += 1
        return {"loss": stats[0], "loss_critic": stats[0], "loss_actor": stats[1],
                "loss_alpha": stats[2], "alpha": stats[3], "entropy": stats[4],
                "q_mean": stats[5], "priorities": priorities}

    def get_weights(self) -> Weights:
        return to_numpy_weights(self.actor)

    def state_dict(self) -> dict[str, Any]:
        if self.numpy_update is not None:  # torch's optimizer format: either path resumes the other's checkpoints
            self.numpy_update.adam.save_to_torch()
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
        self.opt.load_state_dict(state["opt"])
        if self.numpy_update is not None:
            self.numpy_update.adam.load_from_torch()
        self.updates = int(state["updates"])


class SAC(ReplayAlgorithm):
    name = "sac"
    learner_cls = SACLearner
    discrete, box = False, True


ALGORITHM = SAC
