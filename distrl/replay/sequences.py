"""Worker side of sequence replay: cut each env's episodes into chunks and emit sequence items.

Sequences for recurrent learners overlap (with ``period = length / 2`` every step sits in
two trained windows, plus the burn-in and n-step margins), so copying each item's window
would multiply the data sent and stored. Instead every (worker, env) stream stores each step
once, in *chunks* of ``chunk_length`` consecutive steps of one episode, and an *item* only
names the chunks it touches plus where its window starts inside them. A chunk's data travels
once, in the message of the first item that references it; later items carry only its key.

Windows (Acme-style burn-in): with ``L = sequence_length = burn_in + length + n_step``, item
k of an episode covers episode steps ``[k*period - burn_in, k*period - burn_in + L)``: the
burn-in prefix (unrolled without gradient from the stored state), the ``length`` trained
steps, then ``n_step`` steps that only feed bootstrap targets. Items exist for every k with
``k*period`` inside the episode's real steps. For early items the burn-in prefix lies before
the episode start: those positions are left padding (``pad_left``) and the stored state is
zero, which is what the learner resets to at the episode's first step anyway. Windows that
run past the episode end are right-padded.

Episode ends: the last real step gets ``discount`` 0 if the episode terminated (1 if it was
truncated), and one pseudo-step holding the true final observation (mask 0, no action) is
appended, so a truncated episode can still bootstrap from it. Episodes never share chunks.

An item is emitted as soon as every chunk it touches is closed (full, or its episode ended),
so a chunk is final when its data is sent. The adder keeps, per env, only the chunks a
future item can still touch and the recurrent states at future item starts.

Stacked frames (``frame_stack`` k > 0, for the "obs" field): a chunk keeps that field as ``chunk_length
+ k - 1`` frames, its first step's whole stack then each step's newest frame, so step i's stack is
frames ``[i, i + k)``. A chunk never spans an episode start, and each written stack is checked to be
the one rebuilt (an env whose stacks do not shift by one frame is refused). These travel as
``frames/obs`` instead of ``chunk/obs``.

Chunk keys are ``base << 23 | counter`` with a 40-bit base per stream drawn from the seeded
generator mixed with ``os.urandom``: unique across envs and workers by chance, and across
worker restarts (which replay a seed) thanks to the OS entropy.
"""
from __future__ import annotations

import os

import numpy as np

from distrl.replay.frames import as_bytes

ADDED_FIELDS = ("discount", "mask")
FRAMED_FIELD = "obs"  # the field kept as frames when frame_stack > 0
_COUNTER_BITS = 23
_BASE_BITS = 40


def chunks_per_item(sequence_length: int, chunk_length: int) -> int:
    """K: the most chunks a window of ``sequence_length`` steps can touch."""
    return -(-(sequence_length + chunk_length - 1) // chunk_length)


def empty_message(per_step: dict[str, tuple[tuple, np.dtype]], chunk_length: int, sequence_length: int,
                  state_shape: tuple, frames: int = 0) -> dict[str, np.ndarray]:
    """The message of no items: every key an adder's message has, zero rows, the right trailing shapes.

    `per_step` maps each stored field to its per-step (shape, dtype); with `frames` (frame_stack k > 0)
    the framed field travels as k - 1 more frames per chunk, as the adder sends it. A store then treats
    it like any other message (nothing to add) without special keys.
    """
    c = chunk_length
    msg = {f"chunk/{k}": np.zeros((0, c, *shape), dtype) for k, (shape, dtype) in per_step.items()}
    if frames:
        shape, dtype = per_step[FRAMED_FIELD]
        del msg[f"chunk/{FRAMED_FIELD}"]
        msg[f"frames/{FRAMED_FIELD}"] = np.zeros((0, c + frames - 1, *shape[1:]), dtype)
    msg.update({"chunk/key": np.zeros(0, np.int64), "chunk/length": np.zeros(0, np.int32),
                "item/chunks": np.zeros((0, chunks_per_item(sequence_length, c)), np.int64),
                "item/offset": np.zeros(0, np.int32), "item/pad_left": np.zeros(0, np.int32),
                "item/length": np.zeros(0, np.int32), "item/first": np.zeros(0, bool),
                "item/state": np.zeros((0, *state_shape), np.float32), "version": np.zeros(0, np.int32)})
    return msg


class _Keys:
    """Chunk keys of one stream."""

    def __init__(self, rng: np.random.Generator):
        self._rng = rng
        self._new_base()

    def _new_base(self) -> None:
        seeded = int(self._rng.integers(0, 1 << _BASE_BITS))
        fresh = int.from_bytes(os.urandom(5), "little")
        self._base = (seeded ^ fresh) << _COUNTER_BITS
        self._count = 0

    def next(self) -> int:
        if self._count == 1 << _COUNTER_BITS:
            self._new_base()
        self._count += 1
        return self._base | (self._count - 1)


class _Chunk:
    __slots__ = ("data", "key", "length", "sent")

    def __init__(self, key: int, data: dict[str, np.ndarray]):
        self.key, self.data, self.length, self.sent = key, data, 0, False


class _Episode:
    """One env's episode in progress: its chunks by index, counters, states at future item starts."""

    __slots__ = ("chunks", "ended", "next_k", "real", "states", "stored")

    def __init__(self):
        self.chunks: dict[int, _Chunk] = {}
        self.stored = self.real = self.next_k = 0
        self.ended = False
        self.states: dict[int, np.ndarray] = {}


class SequenceAdder:
    """Turns (T, E) fragments of steps into chunked sequence messages for `SequenceReplay`.

    ``sequence_length`` is the whole stored window L = burn_in + length + n_step.
    """

    def __init__(self, num_envs: int, sequence_length: int, period: int, burn_in: int,
                 chunk_length: int, seed: int, frame_stack: int = 0):
        if num_envs < 1 or period < 1 or chunk_length < 1 or burn_in < 0:
            raise ValueError("need num_envs, period, chunk_length >= 1 and burn_in >= 0")
        if sequence_length <= burn_in:
            raise ValueError(f"sequence_length {sequence_length} must exceed burn_in {burn_in}")
        self.num_envs = int(num_envs)
        self.sequence_length = int(sequence_length)
        self.period = int(period)
        self.burn_in = int(burn_in)
        self.chunk_length = int(chunk_length)
        self.chunks_per_item = chunks_per_item(self.sequence_length, self.chunk_length)
        self.frame_stack = int(frame_stack)
        rng = np.random.Generator(np.random.PCG64(seed))
        self._keys = [_Keys(rng) for _ in range(self.num_envs)]
        self._episodes = [_Episode() for _ in range(self.num_envs)]
        self._specs: dict[str, tuple[tuple, np.dtype]] | None = None  # every field kept in chunks
        self._stored: list[str] = []  # the fields that are sent (not aux)
        self._aux: list[str] = []
        self._state_spec: tuple[tuple, np.dtype] | None = None

    def reset(self) -> None:
        """Abandon every env's episode in progress (for envs reset without an episode end)."""
        self._episodes = [_Episode() for _ in range(self.num_envs)]

    def add(self, steps: dict[str, np.ndarray], next_obs: dict[str, np.ndarray],
            terminated: np.ndarray, truncated: np.ndarray, states: np.ndarray, version: int,
            aux: dict[str, np.ndarray] | None = None,
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
        """Add T steps of every env; (message, emitted windows) for the items completed, or None."""
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        next_obs, states = {k: np.asarray(v) for k, v in next_obs.items()}, np.asarray(states)
        data = self._prepare(steps, next_obs, terminated, truncated, states, aux or {})
        done = terminated | truncated
        if len(done) == 0:
            return None
        items: list[dict] = []
        for e in range(self.num_envs):
            self._add_env(e, data, next_obs, done[:, e], states, items)
        if not items:
            return None
        return self._message(items, version), self._emitted(items)

    # ------------------------------------------------------------ input checks
    def _prepare(self, steps, next_obs, terminated, truncated, states, aux) -> dict[str, np.ndarray]:
        if terminated.ndim != 2 or terminated.shape != truncated.shape:
            raise ValueError(f"terminated/truncated must be (T, E), got {terminated.shape}, {truncated.shape}")
        te = terminated.shape
        if te[1] != self.num_envs:
            raise ValueError(f"got {te[1]} envs, adder has {self.num_envs}")
        if "rewards" not in steps or not next_obs:
            raise ValueError("steps needs 'rewards' and next_obs the observation fields")
        clash = (set(steps) | set(aux)) & set(ADDED_FIELDS) or set(steps) & set(aux)
        if clash:
            raise ValueError(f"field names used twice or reserved: {sorted(clash)}")
        discount = np.where(terminated, 0.0, 1.0).astype(np.float32)
        data = {**steps, "discount": discount, "mask": np.ones(te, np.float32), **aux}
        data = {k: np.asarray(v) for k, v in data.items()}
        for k, v in next_obs.items():
            if k not in steps or v.shape != data[k].shape:
                raise ValueError(f"next_obs[{k!r}] must match a step field's shape")
        for k, v in {**data, "states": states}.items():
            if v.shape[:2] != te:
                raise ValueError(f"{k}: leading dims {v.shape[:2]} != {te}")
        self._check_specs(data, states, list(aux))
        return data

    def _check_specs(self, data: dict[str, np.ndarray], states: np.ndarray, aux: list[str]) -> None:
        specs = {k: (v.shape[2:], v.dtype) for k, v in data.items()}
        state_spec = (states.shape[2:], np.dtype(np.float32))
        if self._specs is None:
            self._specs, self._state_spec, self._aux = specs, state_spec, aux
            self._stored = [k for k in specs if k not in aux]
        elif specs != self._specs or state_spec != self._state_spec:
            raise ValueError("field names, shapes or dtypes changed since the first add()")

    # ------------------------------------------------------------ per env
    def _add_env(self, e: int, data, next_obs, done: np.ndarray, states, items: list) -> None:
        T = done.shape[0]
        bounds = [int(t) + 1 for t in np.flatnonzero(done)]
        if not bounds or bounds[-1] != T:
            bounds.append(T)
        t0 = 0
        for t1 in bounds:
            ep = self._episodes[e]
            self._write(ep, e, data, states, t0, t1)
            if done[t1 - 1]:
                self._finish(ep, e, next_obs, t1 - 1)
            self._emit_ready(ep, items)
            if ep.ended:
                self._episodes[e] = _Episode()
            t0 = t1

    def _chunk(self, ep: _Episode, e: int, j: int) -> _Chunk:
        chunk = ep.chunks.get(j)
        if chunk is None:
            data = {k: np.zeros((self.chunk_length, *shape), dtype) for k, (shape, dtype) in self._specs.items()}
            if self.frame_stack:
                shape, dtype = self._specs[FRAMED_FIELD]
                data[FRAMED_FIELD] = np.zeros((self.chunk_length + self.frame_stack - 1, *shape[1:]), dtype)
            chunk = ep.chunks[j] = _Chunk(self._keys[e].next(), data)
        return chunk

    def _put(self, chunk: _Chunk, name: str, r: int, rows: np.ndarray) -> None:
        """Chunk rows [r, r + len(rows)) of a field: as they are, or as frames (see the module doc)."""
        dst = chunk.data[name]
        if not (self.frame_stack and name == FRAMED_FIELD):
            dst[r:r + len(rows)] = rows
            return
        k = self.frame_stack
        if r == 0:
            dst[:k - 1] = rows[0, :-1]
        dst[k - 1 + r:k - 1 + r + len(rows)] = rows[:, -1]
        rebuilt = np.moveaxis(np.lib.stride_tricks.sliding_window_view(dst, k, axis=0)[r:r + len(rows)], -1, 1)
        if not np.array_equal(as_bytes(rebuilt), as_bytes(rows)):
            raise ValueError(f"{name!r} stacks do not shift by one frame per step within an episode, as "
                             f"frame_stack={k} says: this env cannot store its frames once")

    def _write(self, ep: _Episode, e: int, data, states, t0: int, t1: int) -> None:
        """Copy fragment rows [t0, t1) of env e into the episode's chunks, one slice per chunk."""
        a = ep.stored
        b = a + t1 - t0
        self._record_states(ep, states[t0:t1, e], a)
        pos = a
        while pos < b:
            j, r = divmod(pos, self.chunk_length)
            chunk = self._chunk(ep, e, j)
            n = min(self.chunk_length - r, b - pos)
            src = t0 + pos - a
            for name, arr in data.items():
                self._put(chunk, name, r, arr[src:src + n, e])
            chunk.length = r + n
            pos += n
        ep.stored = ep.real = b

    def _record_states(self, ep: _Episode, st: np.ndarray, a: int) -> None:
        """Keep the states before the item starts s > 0 in episode steps [a, a + len(st))."""
        lo = max(a, 1)
        k0 = -(-(lo + self.burn_in) // self.period)
        for s in range(k0 * self.period - self.burn_in, a + len(st), self.period):
            ep.states[s] = np.array(st[s - a], dtype=np.float32)

    def _finish(self, ep: _Episode, e: int, next_obs, t: int) -> None:
        """Append the pseudo-step holding the final observation and close the episode."""
        j, r = divmod(ep.stored, self.chunk_length)
        chunk = self._chunk(ep, e, j)
        for name, arr in next_obs.items():
            self._put(chunk, name, r, arr[t, e][None])
        chunk.length = r + 1
        ep.stored += 1
        ep.ended = True

    def _ready(self, ep: _Episode, k: int) -> bool:
        if ep.ended:
            return k * self.period < ep.real
        last = k * self.period - self.burn_in + self.sequence_length - 1
        return ep.stored >= (last // self.chunk_length + 1) * self.chunk_length

    def _emit_ready(self, ep: _Episode, items: list) -> None:
        while self._ready(ep, ep.next_k):
            items.append(self._item(ep, ep.next_k))
            ep.next_k += 1
        if not ep.ended:  # chunks wholly before the next item's window are never touched again
            j_min = max(ep.next_k * self.period - self.burn_in, 0) // self.chunk_length
            for j in [j for j in ep.chunks if j < j_min]:
                del ep.chunks[j]

    def _item(self, ep: _Episode, k: int) -> dict:
        s = k * self.period - self.burn_in
        lo, hi = max(s, 0), min(s + self.sequence_length, ep.stored)
        j_lo, j_hi = lo // self.chunk_length, (hi - 1) // self.chunk_length
        state = ep.states.pop(s) if s > 0 else np.zeros(*self._state_spec)
        return {"chunks": [ep.chunks[j] for j in range(j_lo, j_hi + 1)],
                "offset": lo - j_lo * self.chunk_length, "pad_left": lo - s, "length": hi - lo,
                "first": s <= 0, "state": state}

    # ------------------------------------------------------------ output
    def _message(self, items: list[dict], version: int) -> dict[str, np.ndarray]:
        send = []
        for it in items:
            for c in it["chunks"]:
                if not c.sent:
                    c.sent = True
                    send.append(c)
        msg = {"chunk/key": np.array([c.key for c in send], np.int64),
               "chunk/length": np.array([c.length for c in send], np.int32)}
        for name in self._stored:
            framed = self.frame_stack and name == FRAMED_FIELD
            shape, dtype = self._specs[name]
            empty = (0, self.chunk_length + self.frame_stack - 1, *shape[1:]) if framed \
                else (0, self.chunk_length, *shape)
            msg[("frames/" if framed else "chunk/") + name] = (np.stack([c.data[name] for c in send]) if send
                                                               else np.zeros(empty, dtype))
        keys = np.full((len(items), self.chunks_per_item), -1, np.int64)
        for i, it in enumerate(items):
            keys[i, :len(it["chunks"])] = [c.key for c in it["chunks"]]
        msg["item/chunks"] = keys
        for name in ("offset", "pad_left", "length"):
            msg["item/" + name] = np.array([it[name] for it in items], np.int32)
        msg["item/first"] = np.array([it["first"] for it in items], bool)
        msg["item/state"] = np.stack([it["state"] for it in items])
        msg["version"] = np.full(len(items), version, np.int32)
        return msg

    def _emitted(self, items: list[dict]) -> dict[str, np.ndarray]:
        """Time-major (L, N, ...) windows of aux, rewards, discount and mask, padded like the sampler."""
        L, N = self.sequence_length, len(items)
        names = [*self._aux, "rewards", *ADDED_FIELDS]
        out = {k: np.zeros((L, N, *self._specs[k][0]), self._specs[k][1]) for k in names}
        out["valid"] = np.zeros((L, N), np.float32)
        for i, it in enumerate(items):
            lo, n, off = it["pad_left"], it["length"], it["offset"]
            out["valid"][lo:lo + n, i] = 1.0
            for k in names:
                seq = np.concatenate([c.data[k] for c in it["chunks"]])
                out[k][lo:lo + n, i] = seq[off:off + n]
        return out
