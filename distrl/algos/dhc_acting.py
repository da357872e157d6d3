"""DHC's acting half and the per-agent target maths both halves share.

DHC (Ma, Luo, Pan 2021) is a parameter-shared recurrent Q-network for N agents that talk to
their neighbours (`distrl.algos.dhc.DHCNetwork`): obs -> encoder -> GRU -> communication block ->
(dueling) Q head. A worker acts with it one joint step at a time; each env's per-agent states
(E, N, S, C) are kept like R2D2's, by the policy's inference (local, or an InferenceServer's).

Shapes: `act` gets {"obs": (E, N, *obs_shape), "comm_mask": (E, N, N) bool, "active": (E, N)}; a structured
observation's "obs" is a tree of (E, N, ...) leaves, its `action_mask` among them (the network masks the Q-values
there, so `epsilon_greedy` explores among the legal actions and the greedy action is a legal one). Replay keeps
a structured observation's leaves as columns of their own (`obs.<key>`, as R2D2's policy stores them), the
mask with them: a step's legal actions travel with its observation, to the targets' max.

Targets, per agent (`agent_nstep_targets`, used by the worker's priorities and the learner):
agent i is trained at step t where mask[t] * active[t, i]; its n-step return sums its rewards
while it stays active on real steps and bootstraps from its value at step t + k where it is
still active (or at the pseudo-step holding the final observation, if active there), unless a
discount was 0. This is R2D2's `nstep_targets` with agents folded into the batch axis.
"""
from __future__ import annotations

import numpy as np

from distrl import tree
from distrl.algos.common import obs_columns
from distrl.algos.r2d2_acting import SequencePolicy, nstep_targets, sequence_priorities
from distrl.core import Batch, Trajectory
from distrl.replay.sequences import empty_message

# ---------------------------------------------------------------- shared per-agent maths
# Arithmetic, reshapes and [..., None] only: the same code runs on numpy arrays and torch tensors.


def agent_nstep_targets(values, rewards, discount, mask, valid, active, gamma: float, n_step: int,
                        start: int, length: int):
    """Per-agent n-step returns (length, B, N) of steps start .. start + length - 1.

    `values`, `rewards`, `active` (float) are (T, B, N); `discount`, `mask`, `valid` (T, B) are
    per joint step. An agent counts as real where mask * active, and may bootstrap where
    valid * active: agents fold into R2D2's batch axis with their own masks.
    """
    T = rewards.shape[0]
    live = mask[..., None] * active
    boot = valid[..., None] * active
    disc = discount[..., None] * (active * 0.0 + 1.0)
    out = nstep_targets(values.reshape(T, -1), rewards.reshape(T, -1), disc.reshape(T, -1),
                        live.reshape(T, -1), boot.reshape(T, -1), gamma, n_step, start, length)
    return out.reshape(length, *rewards.shape[1:])


def agent_priorities(abs_td, live, eta: float):
    """(B,) eta * max + (1 - eta) * mean of |td| over each item's trained (step, agent) pairs.

    Inputs (length, B, N); the agent axis folds into the step axis of `sequence_priorities`.
    """
    n, b, agents = abs_td.shape
    fold = lambda x: x.swapaxes(1, 2).reshape(n * agents, b)  # noqa: E731 - numpy arrays or tensors
    return sequence_priorities(fold(abs_td), fold(live), eta)


# ---------------------------------------------------------------- the policy


class DHCPolicy(SequencePolicy):
    """Epsilon-greedy per agent."""

    def postprocess(self, traj: Trajectory) -> tuple[Batch, np.ndarray]:
        """The adder's message for the items that completed, and their initial priorities."""
        if self._adder is None:
            self._adder = self._make_adder(traj.rewards.shape[1])
        ex = traj.extras
        q, actions = ex["q"], traj.actions.astype(np.int64)
        steps = {**obs_columns(traj.obs), "actions": actions,
                 "rewards": traj.rewards.astype(np.float32, copy=False),
                 "comm_mask": ex["comm_mask"].astype(bool, copy=False), "active": ex["active"].astype(bool, copy=False)}
        nxt = {**obs_columns(traj.next_obs),
               "comm_mask": ex["next_comm_mask"].astype(bool, copy=False),
               "active": ex["next_active"].astype(bool, copy=False)}
        aux = {"q_taken": np.take_along_axis(q, actions[..., None], axis=-1)[..., 0],
               "v": q.max(axis=-1), "v_final": self._final_values(traj), "live": steps["active"].astype(np.float32)}
        out = self._adder.add(steps, nxt, traj.terminated, traj.truncated, ex["state"], self.version, aux)
        if out is None:
            return self._empty_message(steps), np.zeros(0, np.float32)
        message, emitted = out
        return message, self._priorities(emitted)

    def _final_values(self, traj: Trajectory) -> np.ndarray:
        """(T, E, N) max_a Q(s_T) of agents active at the final observation of a truncated episode, else 0
        (the network sees that observation with its comm mask; the max is over its legal actions)."""
        ex, out = traj.extras, np.zeros(traj.rewards.shape, np.float32)
        got = self.after_truncation(
            traj, lambda ts, es: {"obs": tree.index(traj.obs, (ts, es)), "comm_mask": ex["comm_mask"][ts, es],
                                  "active": ex["active"][ts, es]},
            lambda ts, es: {"obs": tree.index(traj.next_obs, (ts, es)), "comm_mask": ex["next_comm_mask"][ts, es],
                            "active": ex["next_active"][ts, es]})
        if got is not None:
            out[got[0]] = got[1]["q"].max(axis=-1) * ex["next_active"][got[0]]
        return out

    def _priorities(self, emitted: dict[str, np.ndarray]) -> np.ndarray:
        """Initial priorities: the learner's TD errors with this worker's network as online and target."""
        cfg, b, n = self.cfg, self.seq.burn_in, self.seq.length
        mask, valid, live = emitted["mask"], emitted["valid"], emitted["live"]
        final = np.zeros_like(emitted["v_final"])
        final[1:] = emitted["v_final"][:-1]  # a pseudo-step bootstraps from v_final of the step before it
        pseudo = (1.0 - mask)[..., None]
        values = emitted["v"] * live + final * pseudo
        # At the pseudo-step `live` is unknown here (aux fields are zero there); v_final is already zero
        # for agents inactive at the final observation, so every agent may bootstrap from it.
        target = agent_nstep_targets(values, emitted["rewards"], emitted["discount"], mask, valid,
                                     live + pseudo, cfg.gamma, cfg.n_step, b, n)
        td = emitted["q_taken"][b:b + n] - target
        trained = mask[b:b + n, :, None] * live[b:b + n]
        return agent_priorities(np.abs(td), trained, cfg.priority_eta).astype(np.float32)

    def _empty_message(self, steps: dict[str, np.ndarray]) -> Batch:
        """The message of no items, with every key and trailing shape of a real one."""
        per_step = {k: (v.shape[2:], v.dtype) for k, v in steps.items()}
        per_step.update(discount=((), np.float32), mask=((), np.float32))
        return empty_message(per_step, self.seq.chunk_length, self.sequence_length, self.state_shape)
