"""R2D2: recurrent Ape-X DQN trained on stored sequences (Kapturowski et al., 2019).

The Q-network is a torso from the torso factory -> LSTM or GRU core -> dueling head. Workers act
with it one step at a time (`distrl.algos.r2d2_acting`, which also holds the target maths both
halves share) and store overlapping sequences of L = burn_in + length + n_step steps together with the recurrent state
the worker had before each sequence's first real step (`distrl.replay.sequences`).

One update on a time-major batch (L, B, ...):

1. Burn-in, steps [0, burn_in): both the online and the target network unroll from the stored
   state under `torch.no_grad()`, so the stale stored state is refreshed by the current weights
   and no gradient reaches these steps or the state they produce.
2. Trained steps [burn_in, burn_in + length) and the n_step bootstrap steps after them: the online
   network continues from its burn-in state with gradient; the target network continues without.
   Wherever `first` is True (an item's first real step is its episode's first) the state is zeroed
   before the step; such resets only happen at or before an item's first real step.
3. Targets: double Q (online argmax, target value) at the bootstrap step, n-step returns that stop
   at an episode's end, and value rescaling y = h(G + gamma^k h^-1(Q_target)).
4. Loss: 0.5 * td^2 on the trained real steps (`mask`), each weighted by its item's importance
   weight and averaged over those steps; Adam with global grad-norm clipping; a hard target copy
   every `target_update_interval` updates. New priorities per item:
   eta * max|td| + (1 - eta) * mean|td| over its trained real steps.

The core (`distrl.models.RecurrentCore`) runs as torch's fused nn.LSTM / nn.GRU over the segments
between resets.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from distrl import tree
from distrl.algos.common import NetworkAlgorithm
from distrl.algos.qlearning import DuelingHead, QLearningConfig, SequenceQLearner
from distrl.algos.r2d2_acting import R2D2Policy, nstep_targets, rescale, sequence_priorities, unrescale
from distrl.config.fields import f
from distrl.config.sections import RecurrentModelConfig
from distrl.core import Learner
from distrl.models import RecurrentCore, make_torso
from distrl.models.masking import apply_mask


@dataclass
class R2D2Config(QLearningConfig):
    value_rescaling: bool = f(True, "targets through h(x) = sign(x)(sqrt(|x|+1) - 1) + eps x and its inverse")
    rescale_eps: float = f(1e-3, "the eps of the value rescaling h", lo=0.0)
    priority_eta: float = f(0.9, "sequence priority: eta * max|td| + (1 - eta) * mean|td|", lo=0.0, hi=1.0)


class R2D2Network(nn.Module):
    """Torso -> recurrent core -> (dueling) Q head, masked where the observation has an action mask; states
    are (B, S, C) (`distrl.models.cores`). `step_ndim`: the rank of one step's first observation leaf (a
    flat observation's own), which tells the leading axes of any input."""

    def __init__(self, torso: nn.Module, step_ndim: int, num_actions: int, core: str, core_size: int,
                 dueling: bool):
        super().__init__()
        self.torso, self.step_ndim = torso, int(step_ndim)
        self.core = RecurrentCore(core, torso.out_features, core_size)
        self.head = DuelingHead(core_size, num_actions, dueling)

    def features(self, obs) -> torch.Tensor:
        """The torso over any leading axes: (..., *step shape) per leaf -> (..., F)."""
        first = tree.leaves(obs)[0]
        n = first.dim() - self.step_ndim
        return self.torso(tree.flatten_lead(obs, n)).view(*first.shape[:n], -1)

    def masked_q(self, out: torch.Tensor, obs) -> torch.Tensor:
        """The head's Q over core outputs, the actions `obs`'s mask (if any) rules out at MASKED."""
        return apply_mask(self.head(out), tree.mask_of(obs))

    def unroll(self, obs: torch.Tensor, state: torch.Tensor, first: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Core outputs (T, B, C) and the final state (B, S, C) over obs (T, B, ...) from `state`, the state
        zeroed before each step where `first` (T, B) is True."""
        return self.core.unroll(self.features(obs), state, first)

    def step(self, obs, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q (B, A), next state (B, S, C)) of one step."""
        out, after = self.core.step(self.features(obs), state)
        return self.masked_q(out, obs), after


class R2D2Learner(SequenceQLearner, Learner):
    """The R2D2 update on time-major sequence batches (see the module docstring)."""

    priorities = staticmethod(sequence_priorities)

    def _unroll_both(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Online Q with gradient and target Q, both (L - burn_in, B, A), after the burn-in."""
        b = self.burn_in
        obs, first, state = t["obs"], t["first"], t["state"]
        after_burn_in = tree.index(obs, slice(b, None))
        with torch.no_grad():
            out, _ = self.target.unroll(obs, state, first)
            q_target = self.target.masked_q(out[b:], after_burn_in)
            if b:
                _, state = self.q.unroll(tree.index(obs, slice(None, b)), state, first[:b])
        out, _ = self.q.unroll(after_burn_in, state, first[b:])
        return self.q.masked_q(out, after_burn_in), q_target

    def loss_and_td(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, td (length, B), Q of the taken actions (length, B)) on a batch of tensors."""
        cfg, b, n = self.cfg, self.burn_in, self.length
        self.check_steps(tree.leaves(t["obs"])[0].shape[0])
        q, q_target = self._unroll_both(t)
        actions = t["actions"][b:b + n].long().unsqueeze(-1)
        q_taken = q[:n].gather(-1, actions).squeeze(-1)
        with torch.no_grad():
            if cfg.double:
                best = q.detach().argmax(dim=-1, keepdim=True)
                values = q_target.gather(-1, best).squeeze(-1)
            else:
                values = q_target.max(dim=-1).values
            if cfg.value_rescaling:
                values = unrescale(values, cfg.rescale_eps)
            target = nstep_targets(values, t["rewards"][b:], t["discount"][b:], t["mask"][b:],
                                   t["valid"][b:], cfg.gamma, cfg.n_step, 0, n)
            if cfg.value_rescaling:
                target = rescale(target, cfg.rescale_eps)
        td = q_taken - target
        mask = t["mask"][b:b + n]
        weights = t["weights"] if "weights" in t else torch.ones_like(mask[0])
        loss = (0.5 * td.square() * mask * weights).sum() / mask.sum().clamp(min=1.0)
        return loss, td.detach(), q_taken.detach()

    def device_step(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        loss, td, q_taken = self.loss_and_td(t)
        return self.step_and_report(loss, td, q_taken, t["mask"][self.burn_in:self.burn_in + self.length])


class R2D2(NetworkAlgorithm):
    name = "r2d2"
    config = R2D2Config
    model_config = RecurrentModelConfig
    model_defaults = {"hidden": [64], "core": "lstm", "core_size": 64}
    actions = ("discrete",)
    structured_obs = True
    data_path = "sequence"
    learner_cls, policy_cls = R2D2Learner, R2D2Policy

    def build_network(self) -> R2D2Network:
        space = self.spec.observation_space
        step_ndim = len(tree.leaf_spaces(space)[0][1].shape)
        return R2D2Network(make_torso(space, self.model, self.image_torso), step_ndim,
                           int(self.spec.action_space.n), self.model.core, self.model.core_size, self.cfg.dueling)
