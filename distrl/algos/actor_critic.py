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
from distrl.config.sections import OptionalCoreModelConfig
from distrl.core import Batch, Learner
from distrl.models import RecurrentCore, make_torso
from distrl.models.masking import apply_mask
from distrl.sampling import Factors


@dataclass
class ActorCriticConfig:
    """What A2C, A3C, PPO and IMPALA share; each has its own section with its own extra keys."""

    shared_torso: bool = f(False, "policy and value heads share one torso (with model.core they always share "
                           "the torso and core)")
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
    MultiDiscrete or MultiBinary action's (`out_dim` is then sum(nvec)). A recurrent `core` serves the policy,
    and the value too unless a `v_torso` (MAPPO's critic: inputs acting lacks) reads it without memory."""

    def __init__(self, pi_torso: nn.Module, v_torso: nn.Module | None, out_dim: int, box: bool,
                 factors: Factors | None = None, core: RecurrentCore | None = None):
        super().__init__()
        self.pi_torso, self.v_torso, self.core = pi_torso, v_torso, core
        width = pi_torso.out_features if core is None else core.out_features
        self.pi_head = nn.Linear(width, out_dim)
        self.v_head = nn.Linear(width if v_torso is None else v_torso.out_features, 1)
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

    def _policy_out(self, h: torch.Tensor, obs) -> torch.Tensor:
        return apply_mask(self.pi_head(h), tree.mask_of(obs))

    def _outputs(self, h: torch.Tensor, hv: torch.Tensor, obs) -> tuple[torch.Tensor, torch.Tensor]:
        return self._policy_out(h, obs), self.v_head(hv).squeeze(-1)

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(policy head output: logits, masked where the observation has an action mask, or Gaussian mean,
        V(obs)) of a feedforward net."""
        h = self.pi_torso(obs)
        return self._outputs(h, h if self.v_torso is None else self.v_torso(obs), obs)

    def forward(self, obs: torch.Tensor):
        out, value = self.heads(obs)
        return self._dist(out), value

    def _named(self, out: torch.Tensor, value: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        named = {"out": out} if value is None else {"out": out, "value": value}
        if self.log_std is not None:
            named["log_std"] = self.log_std.expand_as(out)
        return named

    def act_outputs(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """What acting samples from: the head's output, V(obs) and, for Box actions, the Gaussian's log-std."""
        return self._named(*self.heads(obs))

    def actor_outputs(self, obs) -> dict[str, torch.Tensor]:
        """A feedforward net's `act_outputs` without V(obs) (MAPPO's critic reads inputs acting lacks)."""
        return self._named(self._policy_out(self.pi_torso(obs), obs))

    def act_step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """A recurrent net's `act_outputs` of one step from `state` (B, S, C), and the state after it."""
        h, after = self.core.step(self.pi_torso(obs), state)
        return self._named(*self._outputs(h, h if self.v_torso is None else self.v_torso(obs), obs)), after

    def actor_step(self, obs, state: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """`act_step` without V(obs): a recurrent net's `actor_outputs`."""
        h, after = self.core.step(self.pi_torso(obs), state)
        return self._named(self._policy_out(h, obs)), after

    def unroll(self, obs, state: torch.Tensor, first: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A recurrent net over time-major obs (T, B, ...) from `state` (B, S, C), zeroed before each step where
        `first` (T, B) is True: (head outputs (T, B, A), values (T, B), the state after the last step)."""
        lead = tree.leaves(obs)[0].shape[:2]
        rows = tree.flatten_lead(obs, 2)
        h, after = self.core.unroll(self.pi_torso(rows).view(*lead, -1), state, first)
        out, value = self._outputs(h, h if self.v_torso is None else self.v_torso(rows).view(*lead, -1), obs)
        return out, value, after

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        torso = self.pi_torso if self.v_torso is None else self.v_torso
        return self.v_head(torso(obs)).squeeze(-1)

    def evaluate(self, obs, actions: torch.Tensor, state: torch.Tensor | None = None,
                 first: torch.Tensor | None = None):
        """(log pi(a|s), entropy, V(s)) for stored actions: of rows (N, ...) for a feedforward net; of
        sequences (N, L, ...) from their start states (N, S, C) and episode starts `first` (N, L) for a
        recurrent one, each shaped (N, L)."""
        if self.core is None:
            dist, value = self(obs)
        else:
            time_first = lambda x: x.transpose(0, 1)  # noqa: E731 - the core's layout, and back
            out, value, _ = self.unroll(tree.map(time_first, obs), state, time_first(first))
            dist, value = self._dist(time_first(out)), time_first(value)
        return dist.log_prob(actions), dist.entropy(), value


# --- learning ---------------------------------------------------------------------
def time_major(batch: Batch, device: str) -> dict[str, torch.Tensor]:
    """A fragment batch as tensors, time-major (T, B, ...) as the workers wrote it."""
    return as_tensors(batch, device)


@dataclass
class Estimates:
    """A fragment batch under the learner's current net, without gradient: log pi of the stored actions,
    V(obs) and the bootstrap V(next_obs), each (T, B); a recurrent net's state at each trained sequence's
    start, (T / L, B, S, C)."""

    logp: torch.Tensor
    values: torch.Tensor
    next_values: torch.Tensor
    starts: torch.Tensor | None = None


def episode_starts(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """(T, B): True where a step's episode began after the fragment's first step (the stored state of step 0
    is already its episode's)."""
    ended = t["terminated"].bool() | t["truncated"].bool()
    return torch.cat([torch.zeros_like(ended[:1]), ended[:-1]])


@torch.no_grad()
def estimates(net: ActorCriticNet, t: dict[str, torch.Tensor], recurrence: int | None) -> Estimates:
    """`Estimates` of time-major tensors `t`. A recurrent net unrolls each env's fragment from its stored
    state, `recurrence` steps (all of them: None) at a time, keeping each piece's start state; its bootstrap
    for the last step is one more step on `next_obs[T-1]`, and a truncated episode's the worker's
    `final_value`; a value without memory (a `v_torso` beside the core) bootstraps from `next_obs`."""
    shape = t["rewards"].shape
    if net.core is None:
        logp, _, values = net.evaluate(tree.flatten_lead(t["obs"], 2), tree.flatten_lead(t["actions"], 2))
        return Estimates(logp.view(shape), values.view(shape), net.value(tree.flatten_lead(t["next_obs"], 2)).view(shape))
    T, length = shape[0], recurrence or shape[0]
    state, first = t["state"][0], episode_starts(t)
    starts, outs, values = [], [], []
    for a in range(0, T, length):
        starts.append(state)
        out, value, state = net.unroll(tree.index(t["obs"], slice(a, a + length)), state, first[a:a + length])
        outs.append(out)
        values.append(value)
    logp = net._dist(torch.cat(outs)).log_prob(t["actions"])
    if net.v_torso is not None:
        next_values = net.value(tree.flatten_lead(t["next_obs"], 2)).view(shape)
        return Estimates(logp, torch.cat(values), next_values, torch.stack(starts))
    last = tree.index(t["next_obs"], slice(T - 1, T))
    values.append(net.unroll(last, state)[1])
    values = torch.cat(values)
    next_values = torch.where(t["truncated"].bool() & ~t["terminated"].bool(), t["final_value"], values[1:])
    return Estimates(logp, values[:-1], next_values, torch.stack(starts))


def sample_rows(t: dict[str, torch.Tensor], est: Estimates, recurrence: int | None,
                **per_step: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a loss is taken over, rows first: obs, actions and each of `per_step` ((T, B) tensors) as steps
    (T * B, ...) for a feedforward net; for a recurrent one as sequences (N, L, ...) of L = `recurrence` steps
    (N = T / L * B), with each one's start state ('state', (N, S, C)) and episode starts ('first', (N, L))."""
    steps = {"obs": t["obs"], "actions": t["actions"], **per_step}
    if est.starts is None:
        return {k: tree.flatten_lead(v, 2) for k, v in steps.items()}
    T, B = t["rewards"].shape
    length = recurrence or T

    def sequences(x: torch.Tensor) -> torch.Tensor:  # (T, B, ...) -> (T/L * B, L, ...), sequence-major
        return x.reshape(T // length, length, B, *x.shape[2:]).transpose(1, 2).reshape(-1, length, *x.shape[2:])

    rows = {k: tree.map(sequences, v) for k, v in steps.items()}
    rows["first"] = sequences(episode_starts(t))
    rows["state"] = est.starts.reshape(-1, *est.starts.shape[2:])
    return rows


def cut_fraction(rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """The fraction of trained sequences an episode end cuts (an episode starts after their first step)."""
    return rows["first"][:, 1:].any(1).float().mean()


def normalize(x: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
    """Standardized over every entry, or over those where `live` is 1."""
    if live is None:
        return (x - x.mean()) / (x.std(unbiased=False) + 1e-8)
    count = live.sum().clamp(min=1.0)
    mean = (x * live).sum() / count
    std = (((x - mean) * live).square().sum() / count).sqrt()
    return (x - mean) / (std + 1e-8)


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
        self.cfg, self.device, self.recurrence = algo.cfg, device, algo.recurrence
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
    model_defaults = {"hidden": [64, 64], "activation": "tanh"}
    actions = ("discrete", "box", "multi_discrete", "multi_binary")
    structured_obs = True
    data_path = "trajectory"

    model_config = OptionalCoreModelConfig

    def build_network(self) -> ActorCriticNet:
        act, obs = self.spec.action_space, self.spec.observation_space
        box, factors = isinstance(act, spaces.Box), action_factors(act)
        out_dim = int(np.prod(act.shape)) if box else int(factors.nvec.sum()) if factors else int(act.n)
        pi_torso = make_torso(obs, self.model, self.image_torso)
        if self.recurrent:
            core = RecurrentCore(self.model.core, pi_torso.out_features, self.model.core_size)
            return ActorCriticNet(pi_torso, None, out_dim, box, factors, core)
        v_torso = None if self.cfg.shared_torso else make_torso(obs, self.model, self.image_torso)
        return ActorCriticNet(pi_torso, v_torso, out_dim, box, factors)

    @property
    def recurrent(self) -> bool:
        return self.model.core != "none"

    @property
    def recurrence(self) -> int | None:
        """Steps per trained sequence with a core (`rollout.recurrence`, passed as `sequence`; None: a fragment)."""
        return self.sequence
