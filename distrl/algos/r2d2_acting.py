"""R2D2's acting half and the sequence maths both halves share.

R2D2 (Kapturowski et al., 2019) is Ape-X DQN with a recurrent Q-network trained on stored
sequences. A worker acts with the network one step at a time, one recurrent state per env (reset
when the env's episode ends), and hands every step's state *before* the step to the
`SequenceAdder`, which cuts each episode into overlapping sequences of
`burn_in + length + n_step` steps (see `distrl.replay.sequences` and `SequenceConfig`):

    [ burn-in: unrolled without gradient | length: trained steps | n_step: bootstrap only ]

The stored state of a sequence is the worker's state before its first real step, so the
learner (`distrl.algos.r2d2`) starts from it, lets the burn-in steps refresh it under its
current weights, and trains on the `length` steps after them.

State layout, everywhere (policy extras, stored items, learner batches): float32
(..., S, core_size) with S = 2 for an LSTM ([0] = h, [1] = c) and S = 1 for a GRU ([0] = h).

Targets (shared with the learner through `nstep_targets`, `rescale` and `unrescale`):
y_t = h(sum_{j<k} gamma^j (prod_{i<j} d_{t+i}) r_{t+j} + gamma^k (prod_{i<k} d_{t+i}) h^-1(V_{t+k})),
k <= n the real steps counted from t, with h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x.
"""
from __future__ import annotations

import numpy as np

from distrl import tree
from distrl.algos.common import NetworkPolicy, obs_columns
from distrl.algos.qlearning import epsilon_greedy, worker_epsilon
from distrl.core import Batch, Trajectory
from distrl.replay.sequences import SequenceAdder, empty_message
from distrl.sampling import EpsilonGreedy

# ---------------------------------------------------------------- shared sequence maths
# Written with arithmetic and slicing only, so the same code runs on numpy arrays (worker
# priorities) and torch tensors (learner targets): the two halves cannot disagree.


def rescale(x, eps: float):
    """h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x, as x / (sqrt(|x| + 1) + 1) + eps x (no cancellation near 0)."""
    return x / ((abs(x) + 1.0) ** 0.5 + 1.0) + eps * x


def unrescale(y, eps: float):
    """The exact inverse of `rescale`: sign(y)(((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1).

    Rearranged so that neither eps -> 0 nor y -> 0 subtracts nearly equal numbers:
    with s = sqrt(1 + 4 eps (|y| + 1 + eps)) and u = 2 (|y| + 1 + eps) / (s + 1) (the bracket),
    u^2 - 1 = |y| (2 - 4 eps / (1 + 2 eps + s)) (u + 1) / (s + 1).
    """
    a = abs(y)
    s = (1.0 + 4.0 * eps * (a + 1.0 + eps)) ** 0.5
    u = 2.0 * (a + 1.0 + eps) / (s + 1.0)
    return y * (2.0 - 4.0 * eps / (1.0 + 2.0 * eps + s)) * (u + 1.0) / (s + 1.0)


def nstep_targets(values, rewards, discount, mask, valid, gamma: float, n_step: int, start: int, length: int):
    """Unrescaled n-step returns (length, B) of steps t = start .. start + length - 1.

    All inputs are time-major (T, B) with T >= start + length + n_step; `values` are the
    bootstrap values V_t (already through h^-1). Rewards are summed while steps are real
    (`mask`); the return bootstraps from step t + k, k <= n_step the real steps counted,
    weighted by gamma^k and the discounts (0 after a termination) and by `valid[t + k]`
    (padding never bootstraps).
    """
    def at(x, j):  # x at times t + j for every trained t
        return x[start + j:start + j + length]

    live = at(mask, 0) * 0.0 + 1.0  # steps t .. t + j - 1 all real
    scale = live                     # gamma^j prod_{i<j} d_{t+i}
    ret = live * 0.0
    boot = live * 0.0
    for j in range(n_step):
        live = live * at(mask, j)
        ret = ret + scale * live * at(rewards, j)
        scale = scale * gamma * at(discount, j)
        # The count stops at k = j + 1 when the next step is not real, or when n steps are counted.
        stops = live * (1.0 - at(mask, j + 1)) if j + 1 < n_step else live
        boot = boot + stops * scale * at(valid, j + 1) * at(values, j + 1)
    return ret + boot


def sequence_priorities(abs_td, mask, eta: float):
    """(B,) eta * max|td| + (1 - eta) * mean|td| over each item's trained real steps ((length, B) inputs):
    numpy arrays (a worker's, in float64) or tensors (the learner's, on its device)."""
    if isinstance(abs_td, np.ndarray):
        abs_td = abs_td.astype(np.float64)
    abs_td = abs_td * mask
    count = mask.sum(0).clip(min=1.0)
    peak = abs_td.max(0)
    peak = getattr(peak, "values", peak)  # torch's max over an axis also gives the indices
    return eta * peak + (1.0 - eta) * abs_td.sum(0) / count


# ---------------------------------------------------------------- the policy


class SequencePolicy(NetworkPolicy):
    """What the recurrent epsilon-greedy policies share: their network with one state per env (kept by
    `Policy.infer`'s inference, local or central), how experience is cut into sequences, Ape-X
    per-worker epsilons (the evaluator, index -1, is greedy) and the step count."""

    def __init__(self, algo, worker_index: int, num_workers: int, seed: int):
        super().__init__(algo, worker_index, num_workers, seed)
        self.seq = algo.sequence
        self.seed = seed
        self.env_steps = 0
        core = tuple(self.net.core.state_shape)  # (S, core_size): 2 for an LSTM's h and c, 1 for a GRU's h
        self.state_shape = (algo.spec.num_agents, *core) if algo.multi_agent else core  # one env's
        self._adder: SequenceAdder | None = None  # built at the first postprocess
        self._stepped = False                     # an act since the last episodes_ended

    @property
    def epsilon(self) -> float:
        return worker_epsilon(self.cfg, self.worker_index, self.num_workers, self.env_steps)

    @property
    def sequence_length(self) -> int:
        return self.seq.burn_in + self.seq.length + self.cfg.n_step

    def observe_steps(self, env_steps: int) -> None:
        self.env_steps = env_steps

    def forward(self, obs, state: np.ndarray):
        q, after = self.run("step", obs, state)
        return {"q": q}, after

    def act(self, obs, explore: bool):
        net = self.infer(obs)
        q, before = net["q"], net["state"]
        self._stepped = True
        return epsilon_greedy(q, self.epsilon, self.rng if explore else None), {"q": q, "state": before}

    def initial_state(self, rows: int) -> np.ndarray:
        return np.zeros((rows, *self.state_shape), np.float32)

    def episodes_ended(self, done: np.ndarray) -> None:
        done = np.asarray(done, bool)
        if not self._stepped and self._adder is not None and done.any():
            # Envs reset outside a step (a worker restoring its state): the adder's open episodes
            # would run on into the new ones, so abandon them.
            self._adder.reset()
        self._stepped = False
        super().episodes_ended(done)

    def _make_adder(self, num_envs: int) -> SequenceAdder:
        # frame_stack > 0: the adder keeps each frame of the obs stacks once (the replay rebuilds them)
        return SequenceAdder(num_envs, self.sequence_length, self.seq.period, self.seq.burn_in,
                             self.seq.chunk_length, self.seed, frame_stack=self.spec.frame_stack)


class R2D2Policy(SequencePolicy):
    """Epsilon-greedy recurrent acting; the learner checks that the sequences it receives have the
    length it expects."""

    acting_method = "step"  # what an exported file runs: (obs, state) -> (Q, next state)

    def acting_outputs(self) -> tuple[str, ...]:
        return ("q",)

    def sampling_rule(self) -> EpsilonGreedy:
        """How `act` picks from Q (its `acting_rule()` is None: a simulator acting locally keeps no state)."""
        return EpsilonGreedy(self.epsilon)

    def postprocess(self, traj: Trajectory) -> tuple[Batch, np.ndarray]:
        """The adder's message for the items that completed, and their initial priorities (N,)."""
        if self._adder is None:
            self._adder = self._make_adder(traj.rewards.shape[1])
        q = traj.extras["q"]
        aux = {"q_taken": np.take_along_axis(q, traj.actions[..., None].astype(np.int64), axis=-1)[..., 0],
               "v": q.max(axis=-1), "v_final": self._final_values(traj)}
        # A structured observation's leaves are fields of their own (`obs.image`, ...), as replay keeps them.
        steps = {**obs_columns(traj.obs), "actions": traj.actions,
                 "rewards": traj.rewards.astype(np.float32, copy=False)}
        out = self._adder.add(steps, obs_columns(traj.next_obs),
                              traj.terminated, traj.truncated, traj.extras["state"], self.version, aux)
        if out is None:
            return self._empty_message(traj), np.zeros(0, np.float32)
        message, emitted = out
        return message, self._priorities(emitted)

    def _final_values(self, traj: Trajectory) -> np.ndarray:
        """(T, E) max_a Q(s_T) after each truncated (not terminated) episode's last step, else 0."""
        out = np.zeros(traj.rewards.shape, np.float32)
        got = self.after_truncation(traj, lambda ts, es: tree.index(traj.obs, (ts, es)),
                                    lambda ts, es: tree.index(traj.next_obs, (ts, es)))
        if got is not None:
            out[got[0]] = got[1]["q"].max(axis=1)
        return out

    def _priorities(self, emitted: dict[str, np.ndarray]) -> np.ndarray:
        """Ape-X initial priorities: the learner's TD errors with this worker's Q-values as both networks."""
        cfg, b, n = self.cfg, self.seq.burn_in, self.seq.length
        mask, valid = emitted["mask"], emitted["valid"]
        # Bootstrap values: real steps have their own Q; a pseudo-step takes v_final of the step before it.
        final = np.zeros_like(emitted["v_final"])
        final[1:] = emitted["v_final"][:-1]
        values = emitted["v"] * mask + final * (1.0 - mask)
        if cfg.value_rescaling:
            values = unrescale(values, cfg.rescale_eps)
        target = nstep_targets(values, emitted["rewards"], emitted["discount"], mask, valid,
                               cfg.gamma, cfg.n_step, b, n)
        if cfg.value_rescaling:
            target = rescale(target, cfg.rescale_eps)
        td = emitted["q_taken"][b:b + n] - target
        return sequence_priorities(np.abs(td), mask[b:b + n], cfg.priority_eta).astype(np.float32)

    def _empty_message(self, traj: Trajectory) -> Batch:
        """The message of no items, with every key and trailing shape of a real one."""
        no_obs = obs_columns(tree.index(traj.obs, slice(0, 0)))
        per_step = {**{k: (v.shape[2:], v.dtype) for k, v in no_obs.items()},
                    "actions": (traj.actions.shape[2:], traj.actions.dtype),
                    "rewards": ((), np.float32), "discount": ((), np.float32), "mask": ((), np.float32)}
        return empty_message(per_step, self.seq.chunk_length, self.sequence_length, self.state_shape,
                             self.spec.frame_stack)
