"""R2D2: recurrent Ape-X DQN trained on stored sequences (Kapturowski et al., 2019).

The Q-network is an MLP torso (ReLU) -> LSTM or GRU core -> dueling head. Workers act with it in
numpy (`distrl.algos.r2d2_acting`, which also holds the target maths both halves share) and store
overlapping sequences of L = burn_in + length + n_step steps together with the recurrent state
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

The core runs as torch's fused nn.LSTM / nn.GRU over the segments between resets, which is
faster on a CPU than a Python loop of cells.
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
from torch import nn

from distrl.algos.common import SequenceAlgorithm, SequenceQLearner, as_tensors, mlp
from distrl.algos.r2d2_acting import nstep_targets, rescale, sequence_priorities, unrescale
from distrl.core import Batch, EnvSpec, Learner


class R2D2Network(nn.Module):
    """Torso -> recurrent core -> (dueling) Q head; states are (B, S, C) as in `r2d2_acting`."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: list[int], core: str, core_size: int,
                 dueling: bool):
        super().__init__()
        self.torso = mlp([obs_dim, *hidden])
        self.lstm = core == "lstm"
        self.core = (nn.LSTM if self.lstm else nn.GRU)(hidden[-1], core_size)
        self.advantage = nn.Linear(core_size, num_actions)
        self.value = nn.Linear(core_size, 1) if dueling else None

    def head(self, h: torch.Tensor) -> torch.Tensor:
        adv = self.advantage(h)
        if self.value is None:
            return adv
        return self.value(h) + adv - adv.mean(dim=-1, keepdim=True)

    def unroll(self, obs: torch.Tensor, state: torch.Tensor, keep: torch.Tensor,
               resets: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Core outputs (T, B, C) and the final state (B, S, C) over obs (T, B, D) from `state`.

        `keep` (T, B, 1) is 0 where an item's state resets before the step; `resets` lists the
        steps where any item resets, so the fused core runs once per segment between them.
        """
        x = self.torso(obs)
        hx = state.transpose(0, 1).contiguous()  # (S, B, C): h (and c) in the core's layer-first layout
        hx = (hx[0:1], hx[1:2]) if self.lstm else hx
        cuts = sorted({0, *resets}) + [obs.shape[0]]
        outs = []
        for a, b in itertools.pairwise(cuts):
            if a in resets:
                hx = tuple(s * keep[a] for s in hx) if self.lstm else hx * keep[a]
            out, hx = self.core(x[a:b], hx)
            outs.append(out)
        final = torch.cat(hx, 0) if self.lstm else hx
        return (outs[0] if len(outs) == 1 else torch.cat(outs)), final.transpose(0, 1)


def build_network(spec: EnvSpec, cfg) -> R2D2Network:
    obs_dim = int(np.prod(spec.observation_space.shape))
    return R2D2Network(obs_dim, int(spec.action_space.n), list(cfg.hidden), cfg.core, cfg.core_size,
                       cfg.dueling)


def _resets(first: torch.Tensor, lo: int, hi: int) -> list[int]:
    """Steps in [lo, hi) where some item resets, relative to lo."""
    return (torch.nonzero(first[lo:hi].any(dim=1)).flatten()).tolist()


class R2D2Learner(SequenceQLearner, Learner):
    """The R2D2 update on time-major sequence batches (see the module docstring); `seq` is the SequenceConfig."""

    build_network = staticmethod(build_network)
    priorities = staticmethod(sequence_priorities)

    def _unroll_both(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Online Q with gradient and target Q, both (L - burn_in, B, A), after the burn-in."""
        b = self.burn_in
        obs, first, state = t["obs"], t["first"], t["state"]
        keep = (~first).to(obs.dtype).unsqueeze(-1)
        with torch.no_grad():
            out, _ = self.target.unroll(obs, state, keep, _resets(first, 0, len(obs)))
            q_target = self.target.head(out[b:])
            if b:
                _, state = self.q.unroll(obs[:b], state, keep[:b], _resets(first, 0, b))
        out, _ = self.q.unroll(obs[b:], state, keep[b:], _resets(first, b, len(obs)))
        return self.q.head(out), q_target

    def loss_and_td(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, td (length, B), Q of the taken actions (length, B)) on a batch of tensors."""
        cfg, b, n = self.cfg, self.burn_in, self.length
        self.check_steps(t["obs"].shape[0])
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

    def update(self, batch: Batch) -> dict[str, Any]:
        t = as_tensors(batch, self.device)
        loss, td, q_taken = self.loss_and_td(t)
        return self.step_and_report(loss, td, q_taken, t["mask"][self.burn_in:self.burn_in + self.length])


class R2D2(SequenceAlgorithm):
    name = "r2d2"
    learner_cls = R2D2Learner
    discrete, box = True, False


ALGORITHM = R2D2
