"""DHC's acting half and the per-agent target maths both halves share; numpy only, no torch.

DHC (Ma, Luo, Pan 2021) is a parameter-shared recurrent Q-network for N agents that talk to
their neighbours. Per agent and step (the torch twin is `distrl.algos.dhc.DHCNetwork`):

    obs -> encoder -> GRU -> communication block -> (dueling) Q head

- encoder: for a (C, H, W) field of view, Conv2d(3x3, padding 1) + ReLU per `cfg.encoder`
  entry, flatten, Linear to `core_size` + ReLU; for a flat (D,) observation an MLP
  (`cfg.encoder` sizes, then `core_size`, ReLU after each layer).
- GRU: torch's nn.GRU equations and gate order (r, z, n), reset gate on the hidden term incl.
  its bias. The recurrent state is the GRU's only: communication never feeds back into it.
- communication, `comm_rounds` rounds (skipped when `cfg.comm` is False): multi-head scaled
  dot-product attention in which agent i attends over itself and the agents j with
  comm_mask[i, j] True and active[j] (inactive agents never send). Masked logits are -inf, so
  their weights are exactly 0; the self term keeps every softmax row non-empty (no NaN). The
  attended message m_i updates h_i through a GRU cell, h_i' = GRUCell(m_i, h_i), but only
  for agents with at least one neighbour: an agent with an empty mask row gets no message and
  keeps h_i unchanged (as in DHC, whose mask includes the diagonal).
- head: Linear advantage (and value, when dueling) on the communicated features.

Shapes: `act` gets {"obs": (E, N, *obs_shape), "comm_mask": (E, N, N) bool, "active": (E, N)};
states are (E, N, 1, core_size) float32 everywhere (policy extras, stored items, batches).

Targets, per agent (`agent_nstep_targets`, used by the worker's priorities and the learner):
agent i is trained at step t where mask[t] * active[t, i]; its n-step return sums its rewards
while it stays active on real steps and bootstraps from its value at step t + k where it is
still active (or at the pseudo-step holding the final observation, if active there), unless a
discount was 0. This is R2D2's `nstep_targets` with agents folded into the batch axis.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from distrl.algos.common import numpy_linear, numpy_sequential
from distrl.algos.r2d2_acting import SequencePolicy, nstep_targets, sequence_priorities
from distrl.config.sections import SequenceConfig
from distrl.core import Batch, EnvSpec, Trajectory, Weights
from distrl.replay.sequences import SequenceAdder, chunks_per_item

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


def agent_priorities(abs_td: np.ndarray, live: np.ndarray, eta: float) -> np.ndarray:
    """(B,) eta * max + (1 - eta) * mean of |td| over each item's trained (step, agent) pairs.

    Inputs (length, B, N); the agent axis folds into the step axis of `sequence_priorities`.
    """
    n, b, agents = abs_td.shape
    fold = lambda x: np.moveaxis(np.asarray(x), 2, 1).reshape(n * agents, b)
    return sequence_priorities(fold(abs_td), fold(live), eta)


# ---------------------------------------------------------------- the network in numpy


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def _gru_params(weights: Weights, prefix: str, suffix: str = "") -> tuple:
    get = lambda name: np.asarray(weights[f"{prefix}.{name}{suffix}"], np.float32)
    return (np.ascontiguousarray(get("weight_ih").T), np.ascontiguousarray(get("weight_hh").T),
            get("bias_ih"), get("bias_hh"))


def gru_cell(x: np.ndarray, h: np.ndarray, params: tuple) -> np.ndarray:
    """torch's GRU step: r, z, n gates; n = tanh(W_in x + b_in + r * (W_hn h + b_hn))."""
    w_ih, w_hh, b_ih, b_hh = params
    xr, xz, xn = np.split(x @ w_ih + b_ih, 3, axis=-1)
    hr, hz, hn = np.split(h @ w_hh + b_hh, 3, axis=-1)
    r, z = _sigmoid(xr + hr), _sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h


def conv3x3_relu(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Conv2d(k=3, padding=1) + ReLU on channel-last x (M, H, W, Cin); w is (9 * Cin, Cout), rows (kh, kw, cin)."""
    m, height, width, cin = x.shape
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    # (M, H, W, 3, 3, Cin): channels innermost, so the im2col copy reads contiguous runs
    cols = sliding_window_view(padded, (3, 3), axis=(1, 2)).transpose(0, 1, 2, 4, 5, 3)
    out = cols.reshape(m * height * width, 9 * cin) @ w + b
    return np.maximum(out, 0.0).reshape(m, height, width, -1)


def attention_allowed(comm_mask: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(allowed (..., N, N): self or a live neighbour, has_message (..., N): some neighbour)."""
    n = comm_mask.shape[-1]
    eye = np.eye(n, dtype=bool)
    neighbours = np.asarray(comm_mask, bool) & np.asarray(active, bool)[..., None, :] & ~eye
    return neighbours | eye, neighbours.any(axis=-1)


class NumpyDHCNet:
    """`DHCNetwork` from its state_dict; one joint step of E envs x N agents at a time."""

    def __init__(self, weights: Weights, obs_shape: tuple, heads: int):
        self.image = len(obs_shape) == 3
        layers = sorted({int(k.split(".")[1]) for k in weights if k.startswith("conv.")})
        # (Cout, Cin, 3, 3) -> (3 * 3 * Cin, Cout): the row order of `conv3x3_relu`'s windows
        self.conv = [(np.ascontiguousarray(np.asarray(weights[f"conv.{i}.weight"], np.float32)
                                           .transpose(2, 3, 1, 0).reshape(-1, len(weights[f"conv.{i}.bias"]))),
                      np.asarray(weights[f"conv.{i}.bias"], np.float32)) for i in layers]
        if self.image:
            # torch flattens (C, H, W); our activations are channel-last (H, W, C): permute the rows once.
            w, b = numpy_linear(weights, "proj")
            c = self.conv[-1][0].shape[1] if self.conv else obs_shape[0]  # channels into proj
            rows = w.reshape(c, *obs_shape[1:], -1).transpose(1, 2, 0, 3).reshape(w.shape)
            self.proj = (np.ascontiguousarray(rows), b)
        else:
            self.torso = numpy_sequential(weights, "torso")
        self.core = _gru_params(weights, "core", "_l0")
        rounds = sorted({int(k.split(".")[1]) for k in weights if k.startswith("comm.")})
        self.comm = [(numpy_linear(weights, f"comm.{r}.qkv"), _gru_params(weights, f"comm.{r}.update"))
                     for r in rounds]
        self.heads = heads
        self.adv = numpy_linear(weights, "advantage")
        self.value = numpy_linear(weights, "value") if "value.weight" in weights else None

    def encode(self, obs: np.ndarray) -> np.ndarray:
        """Features (M, core_size) of observations (M, *obs_shape)."""
        x = np.asarray(obs, np.float32)
        if not self.image:
            for w, b in self.torso:
                x = np.maximum(x @ w + b, 0.0)
            return x
        x = x.transpose(0, 2, 3, 1)  # channel-last: the 3x3 windows line up with torch's weights
        for w, b in self.conv:
            x = conv3x3_relu(x, w, b)
        w, b = self.proj
        return np.maximum(x.reshape(len(x), -1) @ w + b, 0.0)

    def communicate(self, h: np.ndarray, comm_mask: np.ndarray, active: np.ndarray) -> np.ndarray:
        """The communication block on GRU outputs h (..., N, C); identity without rounds."""
        if not self.comm:
            return h
        allowed, has_message = attention_allowed(comm_mask, active)
        allowed = allowed[..., None, :, :]  # broadcast over heads
        for (w, b), update in self.comm:
            qkv = (h @ w + b).reshape(*h.shape[:-1], 3, self.heads, -1)
            q, k, v = (np.moveaxis(qkv[..., i, :, :], -2, -3) for i in range(3))  # (..., H, N, d)
            logits = np.where(allowed, q @ np.swapaxes(k, -1, -2) / float(np.sqrt(q.shape[-1])), -np.inf)
            weights = np.exp(logits - logits.max(axis=-1, keepdims=True))  # the self term keeps the max finite
            weights /= weights.sum(axis=-1, keepdims=True)
            message = np.moveaxis(weights @ v, -3, -2).reshape(*h.shape[:-1], -1)
            h = np.where(has_message[..., None], gru_cell(message, h, update), h)
        return h

    def head(self, h: np.ndarray) -> np.ndarray:
        adv = h @ self.adv[0] + self.adv[1]
        if self.value is None:
            return adv
        return (h @ self.value[0] + self.value[1]) + adv - adv.mean(axis=-1, keepdims=True)

    def core_step(self, obs: np.ndarray, state: np.ndarray) -> np.ndarray:
        """GRU outputs (E, N, C) = the next hidden state, from obs (E, N, *obs_shape), states (E, N, 1, C)."""
        e, n = obs.shape[:2]
        x = self.encode(obs.reshape(e * n, *obs.shape[2:]))
        return gru_cell(x, state.reshape(e * n, -1), self.core).reshape(e, n, -1)

    def step(self, obs, state, comm_mask, active) -> tuple[np.ndarray, np.ndarray]:
        """(Q (E, N, A), next state (E, N, 1, C))."""
        h = self.core_step(obs, state)
        return self.head(self.communicate(h, comm_mask, active)), h[:, :, None, :]


# ---------------------------------------------------------------- the policy


class DHCPolicy(SequencePolicy):
    """Epsilon-greedy per agent."""

    def __init__(self, spec: EnvSpec, cfg, worker_index: int, num_workers: int, seed: int,
                 sequence: SequenceConfig | None = None):
        super().__init__(spec, cfg, worker_index, num_workers, seed, sequence)
        self.obs_shape = tuple(spec.observation_space.shape)
        self.state_shape = (1, int(cfg.core_size))  # per agent
        self._net: NumpyDHCNet | None = None
        self._state: np.ndarray | None = None  # (E, N, 1, C), built at the first act
        self._adder: SequenceAdder | None = None
        self._stepped = False

    def set_weights(self, weights: Weights, version: int) -> None:
        self._net = NumpyDHCNet(weights, self.obs_shape, self.cfg.comm_heads)
        self.version = version

    def act(self, obs: dict[str, np.ndarray], explore: bool):
        if self._net is None:
            raise RuntimeError("DHCPolicy has no weights yet: call set_weights first")
        x = np.asarray(obs["obs"], np.float32)
        e, n = x.shape[:2]
        if self._state is None or self._state.shape[:2] != (e, n):
            self._state = np.zeros((e, n, *self.state_shape), np.float32)
        before = self._state  # never written in place after this: `step` returns a new array
        q, self._state = self._net.step(x, before, obs["comm_mask"], obs["active"])
        actions = q.argmax(axis=-1)
        if explore:
            random = self.rng.random((e, n)) < self.epsilon
            actions = np.where(random, self.rng.integers(0, self.num_actions, (e, n)), actions)
        self._stepped = True
        return actions.astype(np.int64), {"q": q.astype(np.float32, copy=False), "state": before}

    def episodes_ended(self, done: np.ndarray) -> None:
        done = np.asarray(done, bool)
        if not self._stepped and self._adder is not None and done.any():
            self._adder.reset()  # envs reset outside a step (a worker restore): abandon open episodes
        self._stepped = False
        if self._state is not None and len(self._state) == len(done):
            self._state[done] = 0.0
        else:
            self._state = None  # rebuilt (zero) at the next act, when the agent count is known

    def postprocess(self, traj: Trajectory) -> tuple[Batch, np.ndarray]:
        """The adder's message for the items that completed, and their initial priorities."""
        if self._adder is None:
            self._adder = SequenceAdder(traj.obs.shape[1], self.sequence_length, self.seq.period,
                                        self.seq.burn_in, self.seq.chunk_length, self.seed)
        ex = traj.extras
        q, actions = ex["q"], traj.actions.astype(np.int64)
        steps = {"obs": traj.obs.astype(np.float32, copy=False), "actions": actions,
                 "rewards": traj.rewards.astype(np.float32, copy=False),
                 "comm_mask": ex["comm_mask"].astype(bool, copy=False), "active": ex["active"].astype(bool, copy=False)}
        nxt = {"obs": traj.next_obs.astype(np.float32, copy=False),
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
        """(T, E, N) max_a Q(s_T) of agents active at the final observation of a truncated episode, else 0.

        The policy never acted on the final observation: replay the last step's GRU from its stored
        state, then run the network on the final observation with its comm mask.
        """
        out = np.zeros(traj.rewards.shape, np.float32)
        ts, es = np.nonzero(traj.truncated & ~traj.terminated)
        if len(ts):
            ex = traj.extras
            after = self._net.core_step(traj.obs[ts, es].astype(np.float32), ex["state"][ts, es])
            q, _ = self._net.step(traj.next_obs[ts, es].astype(np.float32), after[:, :, None],
                                  ex["next_comm_mask"][ts, es], ex["next_active"][ts, es])
            out[ts, es] = q.max(axis=-1) * ex["next_active"][ts, es]
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
        c = self.seq.chunk_length
        fields = {k: (v.shape[2:], v.dtype) for k, v in steps.items()}
        fields.update(discount=((), np.float32), mask=((), np.float32))
        msg = {f"chunk/{k}": np.zeros((0, c, *shape), dtype) for k, (shape, dtype) in fields.items()}
        agents = steps["obs"].shape[2]
        msg.update({"chunk/key": np.zeros(0, np.int64), "chunk/length": np.zeros(0, np.int32),
                    "item/chunks": np.zeros((0, chunks_per_item(self.sequence_length, c)), np.int64),
                    "item/offset": np.zeros(0, np.int32), "item/pad_left": np.zeros(0, np.int32),
                    "item/length": np.zeros(0, np.int32), "item/first": np.zeros(0, bool),
                    "item/state": np.zeros((0, agents, *self.state_shape), np.float32),
                    "version": np.zeros(0, np.int32)})
        return msg
