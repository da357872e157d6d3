"""DHC: a parameter-shared recurrent Q-network for communicating agents (Ma, Luo, Pan 2021).

The network (`DHCNetwork`, one set of weights for every agent): a torso from the torso factory
(by default padded 3x3 convs over a field of view, or an MLP over flat observations) and a
Linear + ReLU to the core's width -> GRU (or LSTM) -> communication block -> (dueling) Q head. The block is
`comm_rounds` rounds of multi-head attention of each agent over itself and its live neighbours
in the stored communication mask (masked logits are -inf, so masked agents get weight exactly 0
and the self term keeps every row non-empty), each followed by a GRU-cell update of agents that
have a neighbour. It works on the GRU's outputs and never feeds back into the recurrence, so an
update unrolls the GRU per agent (agents folded into the batch: one fused nn.GRU call per segment
between resets) and then runs the block on all steps at once (one batched attention call).

Experience is R2D2's: sequences of L = burn_in + length + n_step joint steps from
`SequenceReplay`, with per-step fields (N, ...): obs, actions, rewards (per agent), comm_mask and
active (both as the worker saw them: the learner never recomputes the mask), plus the per-step
discount, mask and valid. One update on a time-major batch (L, B, N, ...):

1. Burn-in, steps [0, burn_in): both networks unroll from the stored per-agent GRU states under
   `torch.no_grad()`; then the online network continues with gradient, the target without.
   Wherever `first` is True the state of every agent of that item is zeroed before the step.
2. Targets per agent: double Q (online argmax, target value), n-step returns over the steps on
   which the agent is active (its return stops when it goes inactive, an inactive agent never
   bootstraps), bootstrapping at the pseudo-step of a truncated episode for agents active there,
   never after a termination (`agent_nstep_targets`). No value rescaling.
3. Loss: 0.5 * td^2 over trained (step, agent) pairs, mask[t] * active[t, i], weighted by the
   item's importance weight, averaged over those pairs; Adam, grad-norm clipping, a hard target
   copy every `target_update_interval` updates. Priorities per item: eta * max|td| +
   (1 - eta) * mean|td| over its trained (step, agent) pairs.

Cost: the encoder dominates, so it runs only on stored steps of active agents (`rows`); padding
and inactive agents (whose observations are zero) get the encoder's output for a zero input.

Observations: an agent's is a Box (the MAPF field of view, a flat vector) or a Dict or Tuple tree of leaves
(`distrl.tree`, merged over agents by `distrl.envs.multiagent_obs`), which the torso factory's multi-input
torso encodes. Where that tree has an `action_mask` leaf (1 = legal), the Q head sets the masked actions'
values to MASKED (`distrl.models.masking`, as R2D2's network does): epsilon-greedy then explores among the
legal actions only, greedy acting (workers, evaluator, central inference) picks a legal one, and the targets'
max (or double-Q argmax) is over the legal actions of the bootstrap step, whose mask is stored with its
observation in the sequence replay (`obs.action_mask`). An agent out of the episode has a mask allowing every
action (its row acts on nothing); replay's padding has none allowed, and neither trains nor bootstraps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from distrl import tree
from distrl.algos.common import NetworkAlgorithm
from distrl.algos.dhc_acting import DHCPolicy, agent_nstep_targets, agent_priorities
from distrl.algos.qlearning import DuelingHead, QLearningConfig, SequenceQLearner
from distrl.config.fields import f
from distrl.config.sections import RecurrentModelConfig
from distrl.core import Learner
from distrl.models import RecurrentCore, make_torso
from distrl.models.masking import apply_mask


@dataclass
class DHCConfig(QLearningConfig):
    comm: bool = f(True, "exchange messages between agents (off: independent parameter-shared agents)")
    comm_heads: int = f(2, "attention heads of the communication block", lo=1)
    comm_rounds: int = f(1, "rounds of communication per step", lo=1)
    priority_eta: float = f(0.9, "sequence priority: eta * max|td| + (1 - eta) * mean|td| over agents and steps", lo=0.0, hi=1.0)
    target_update_interval: int = f(200, "updates between target-network copies", lo=1)
    eps_decay_steps: int = f(20000, "worker env steps over which a single worker's epsilon decays", lo=1)


class CommRound(nn.Module):
    """One round: multi-head attention over self + live neighbours, then h_i' = GRUCell(m_i, h_i)."""

    def __init__(self, size: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = max(1, size // heads)
        self.qkv = nn.Linear(size, 3 * heads * self.head_dim)
        self.update = nn.GRUCell(heads * self.head_dim, size)

    def forward(self, h: torch.Tensor, allowed: torch.Tensor, has_message: torch.Tensor) -> torch.Tensor:
        """h (M, N, C); allowed (M, 1, N, N) bool (receiver, sender); has_message (M, N, 1) bool."""
        m, n, c = h.shape
        q, k, v = self.qkv(h).view(m, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        logits = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
        message = (weights @ v).transpose(1, 2).reshape(m * n, -1)  # (M*N, heads * head_dim)
        new = self.update(message, h.reshape(m * n, c)).view(m, n, c)
        return torch.where(has_message, new, h)  # no neighbour: no message, h unchanged


class DHCNetwork(nn.Module):
    """Encoder -> recurrent core -> communication -> (dueling) Q, masked where the observation has an action
    mask; states are (B, N, S, C) (S = 1 for a GRU). Observations are tensors, or trees of them (leaves with
    the same leading axes)."""

    static = False  # encode every row, reading nothing back from the device (`distrl.algos.capture`)

    def __init__(self, torso: nn.Module, num_actions: int, core: str, core_size: int,
                 comm: bool, heads: int, rounds: int, dueling: bool):
        super().__init__()
        self.torso = torso
        self.proj = nn.Linear(torso.out_features, core_size)
        self.core = RecurrentCore(core, core_size, core_size)
        self.comm = nn.ModuleList([CommRound(core_size, heads) for _ in range(rounds)] if comm else [])
        self.head = DuelingHead(core_size, num_actions, dueling)

    def encode(self, obs) -> torch.Tensor:
        """(M, core_size) features of M observations (M rows of every leaf)."""
        return torch.relu(self.proj(self.torso(obs)))

    def features(self, obs, rows: torch.Tensor | None) -> torch.Tensor:
        """(T, B*N, C) features of obs (T, B, N, ...); where `rows` is False the obs is zero, so
        those rows take the features of a zero observation, computed once."""
        t, b, n = tree.leaves(obs)[0].shape[:3]
        flat = tree.map(lambda x: x.reshape(t * b * n, *x.shape[3:]), obs)
        if rows is None or self.static or bool(rows.all()):  # static: a zero observation's features are the blank
            return self.encode(flat).view(t, b * n, -1)
        idx = torch.nonzero(rows.reshape(-1)).flatten()
        blank = self.encode(tree.map(lambda x: x.new_zeros(1, *x.shape[1:]), flat)).expand(t * b * n, -1)
        if not len(idx):  # no stored step of an active agent (a batch of agents out at once): no rows to encode
            return blank.reshape(t, b * n, -1)
        out = blank.index_copy(0, idx, self.encode(tree.index(flat, idx)))
        return out.view(t, b * n, -1)

    def recurrent(self, obs, state, first, rows=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Core outputs (T, B, N, C) and final state (B, N, S, C) from obs (T, B, N, ...), state
        (B, N, S, C), first (T, B) (zero every agent's state before such a step)."""
        t, b, n = tree.leaves(obs)[0].shape[:3]
        agents_first = first[:, :, None].expand(t, b, n).reshape(t, b * n)
        out, final = self.core.unroll(self.features(obs, rows), state.reshape(b * n, *state.shape[2:]),
                                      agents_first)
        return out.view(t, b, n, -1), final.view(b, n, *final.shape[1:])

    def communicate(self, h: torch.Tensor, comm_mask: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """The communication block on h (..., N, C) with comm_mask (..., N, N), active (..., N)."""
        if not len(self.comm):
            return h
        lead, n = h.shape[:-2], h.shape[-2]
        eye = torch.eye(n, dtype=torch.bool, device=h.device)
        neighbours = comm_mask.bool() & active.bool()[..., None, :] & ~eye  # inactive agents never send
        allowed = (neighbours | eye).reshape(-1, 1, n, n)
        has_message = neighbours.any(dim=-1).reshape(-1, n, 1)
        h = h.reshape(-1, n, h.shape[-1])
        for rnd in self.comm:
            h = rnd(h, allowed, has_message)
        return h.view(*lead, n, -1)

    def q_values(self, h, comm_mask, active, action_mask=None) -> torch.Tensor:
        """Q (..., N, A) of core outputs h (..., N, C); the actions `action_mask` (..., N, A) rules out at MASKED."""
        return apply_mask(self.head(self.communicate(h, comm_mask, active)), action_mask)

    def step(self, obs: dict, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One joint step of E envs: (Q (E, N, A), next state (E, N, S, C)) from {"obs" (E, N, ...; a tree of
        such leaves, its mask among them), "comm_mask" (E, N, N), "active" (E, N)} and states (E, N, S, C)."""
        x = obs["obs"]
        e, n = tree.leaves(x)[0].shape[:2]
        out, after = self.core.step(self.encode(tree.map(lambda v: v.reshape(e * n, *v.shape[2:]), x)),
                                    state.reshape(e * n, *state.shape[2:]))
        q = self.q_values(out.view(e, n, -1), obs["comm_mask"], obs["active"], tree.mask_of(x))
        return q, after.view(e, n, *after.shape[1:])


class DHCLearner(SequenceQLearner, Learner):
    """The DHC update on time-major multi-agent sequence batches (module docstring)."""

    priorities = staticmethod(agent_priorities)

    def _unroll_both(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Online Q with gradient and target Q, both (L - burn_in, B, N, A), after the burn-in."""
        b = self.burn_in
        obs, first, state, cm, active = t["obs"], t["first"], t["state"], t["comm_mask"], t["active"]
        rows = (t["valid"] > 0)[..., None] & active.bool()  # stored steps of active agents
        after = tree.index(obs, slice(b, None))
        mask = tree.mask_of(after)  # each step's legal actions: the targets' max is over the bootstrap step's
        with torch.no_grad():
            out, _ = self.target.recurrent(obs, state, first, rows)
            q_target = self.target.q_values(out[b:], cm[b:], active[b:], mask)
            if b:
                _, state = self.q.recurrent(tree.index(obs, slice(None, b)), state, first[:b], rows[:b])
        out, _ = self.q.recurrent(after, state, first[b:], rows[b:])
        return self.q.q_values(out, cm[b:], active[b:], mask), q_target

    def loss_and_td(self, t: dict[str, torch.Tensor]):
        """(loss, td (length, B, N), Q of the taken actions (length, B, N), trained pairs (length, B, N))."""
        cfg, b, n = self.cfg, self.burn_in, self.length
        self.check_steps(tree.leaves(t["obs"])[0].shape[0])
        q, q_target = self._unroll_both(t)
        active = t["active"][b:].to(q.dtype)
        q_taken = q[:n].gather(-1, t["actions"][b:b + n].long().unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            if cfg.double:
                values = q_target.gather(-1, q.detach().argmax(dim=-1, keepdim=True)).squeeze(-1)
            else:
                values = q_target.max(dim=-1).values
            target = agent_nstep_targets(values, t["rewards"][b:], t["discount"][b:], t["mask"][b:],
                                         t["valid"][b:], active, cfg.gamma, cfg.n_step, 0, n)
        td = q_taken - target
        live = t["mask"][b:b + n, :, None] * active[:n]
        weights = t["weights"] if "weights" in t else torch.ones_like(live[0, :, 0])
        loss = (0.5 * td.square() * live * weights[:, None]).sum() / live.sum().clamp(min=1.0)
        return loss, td.detach(), q_taken.detach(), live


class DHC(NetworkAlgorithm):
    name = "dhc"
    config = DHCConfig
    model_config = RecurrentModelConfig
    model_defaults = {"hidden": [32, 32], "conv_channels": [32, 32], "core": "gru", "core_size": 64}
    image_torso = "conv3x3"  # a field of view is a few cells wide: no striding CNN fits it
    actions = ("discrete",)
    structured_obs = True  # Dict and Tuple observations, an action mask among them
    data_path = "sequence"
    multi_agent = True
    learner_cls, policy_cls = DHCLearner, DHCPolicy

    def build_network(self) -> DHCNetwork:
        space, c, m = self.spec.observation_space, self.cfg, self.model
        return DHCNetwork(make_torso(space, m, self.image_torso), int(self.spec.action_space.n),
                          m.core, m.core_size, c.comm, c.comm_heads, c.comm_rounds, c.dueling)
