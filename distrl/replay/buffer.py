"""Ring replay buffer with optional proportional prioritization (PER)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from distrl import tree
from distrl.replay.frame_ring import FrameRing
from distrl.replay.frames import FLAT, FRAMES, MESSAGE_KEYS, NEXT_REF, OBS_REF, STACK, framed_columns, framed_key
from distrl.replay.sumtree import SumTree, stratified_sample

GENERATION_KEY = "_generation"
OLDEST_KEY = "frame_oldest"  # per item of a framed replay: the oldest frame its stacks read (per framed column)
_STORAGE_PREFIX = "storage/"


class ReplayBuffer:
    """Fixed-capacity FIFO replay over dicts of numpy arrays.

    Storage is allocated lazily from the first :meth:`add`. In prioritized
    mode the sum tree stores ``(|p| + eps) ** alpha``; sampling is stratified
    and returns normalised importance weights. Every slot carries a write
    generation so late priority updates for overwritten slots are dropped.
    Framed messages (`distrl.replay.frames`) keep each observation column they
    frame in a `FrameRing` of its own; items hold refs into it.
    """

    def __init__(
        self,
        capacity: int,
        prioritized: bool = True,
        alpha: float = 0.6,
        beta0: float = 0.4,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
        seed: int = 0,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.prioritized = bool(prioritized)
        self.alpha = float(alpha)
        self.beta0 = float(beta0)
        self.beta_steps = max(1, int(beta_steps))
        self.eps = float(eps)
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._storage: dict[str, np.ndarray] | None = None
        self._gen = np.zeros(self.capacity, dtype=np.int64)
        self._tree = SumTree(self.capacity) if self.prioritized else None
        self._cursor = 0
        self._size = 0
        self._sample_count = 0
        self._max_priority = 1.0
        self._frames: dict[str, FrameRing] = {}  # observation column -> its frames (framed messages only)

    def __len__(self) -> int:
        return self._size

    @property
    def beta(self) -> float:
        """Importance-sampling exponent used by the next sample call."""
        return float(self._beta_at(self._sample_count))

    def _beta_at(self, count: np.ndarray | int) -> np.ndarray | float:
        frac = np.minimum(1.0, np.asarray(count, dtype=np.float64) / self.beta_steps)
        out = self.beta0 + (1.0 - self.beta0) * frac
        return float(out) if np.ndim(out) == 0 else out

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage arrays and the frame rings (0 before the first add)."""
        if self._storage is None:
            return 0
        return int(sum(a.nbytes for a in self._storage.values()) + sum(r.nbytes for r in self._frames.values()))

    @property
    def checkpoint_nbytes(self) -> int:
        """Bytes of stored items a checkpoint writes (the filled slots only)."""
        if self._storage is None:
            return 0
        rows = sum(a.nbytes for a in self._storage.values()) * self._size // self.capacity
        return int(rows + sum(r.live_nbytes for r in self._frames.values()))

    @property
    def bytes_per_item(self) -> float:
        """Real bytes per stored item: the live items' fields, generations and share of the sum tree, plus
        the frames in the rings (0.0 when empty)."""
        if self._size == 0 or self._storage is None:
            return 0.0
        row = sum(a.nbytes for a in self._storage.values()) + self._gen.nbytes
        row += self._tree.nbytes if self._tree is not None else 0
        frames = sum(r.live_nbytes for r in self._frames.values())
        return (row * self._size / self.capacity + frames) / self._size

    def _live(self, n: int | None = None) -> np.ndarray:
        """Slots of the n oldest live items (all by default), oldest first."""
        n = self._size if n is None else n
        return (self._cursor - self._size + np.arange(n)) % self.capacity

    def _leaf_values(self, p: np.ndarray) -> np.ndarray:
        return (np.abs(p).astype(np.float64) + self.eps) ** self.alpha

    # ------------------------------------------------------------------ add
    def _validate(self, items: dict[str, np.ndarray]) -> int:
        if not items:
            raise ValueError("add() needs at least one key")
        if GENERATION_KEY in items:
            raise ValueError(f"key {GENERATION_KEY!r} is reserved")
        if self._storage is not None:
            for k in items:
                if k not in self._storage:
                    raise ValueError(f"unknown key {k!r} (buffer has {sorted(self._storage)})")
            for k in self._storage:
                if k not in items:
                    raise ValueError(f"missing key {k!r} in fragment")
        sizes = {k: np.shape(v)[0] if np.ndim(v) else None for k, v in items.items()}
        if None in sizes.values() or len(set(sizes.values())) != 1:
            raise ValueError(f"all arrays need the same leading dim, got {sizes}")
        if self._storage is not None:
            for k, v in items.items():
                if np.shape(v)[1:] != self._storage[k].shape[1:]:
                    raise ValueError(
                        f"key {k!r}: item shape {np.shape(v)[1:]} != {self._storage[k].shape[1:]}"
                    )
        return int(next(iter(sizes.values())))

    def add(self, items: dict[str, np.ndarray], priorities: np.ndarray | None = None) -> None:
        """Append a fragment of B items (FIFO; keeps only the newest ``capacity``); a structured observation's
        leaves are columns of their own (`distrl.tree.to_columns`)."""
        items = tree.to_columns(items)
        framed = framed_columns(items)
        if framed:
            items, priorities = self._add_frames(items, priorities, framed)
        b = self._validate(items)
        if b == 0:
            return
        n = min(b, self.capacity)
        # Validate priorities before touching storage so a bad call changes nothing.
        vals = None
        new_max = self._max_priority
        if self._tree is not None:
            if priorities is None:
                vals = np.full(n, self._leaf_values(np.float64(self._max_priority)))
            else:
                p = np.asarray(priorities, dtype=np.float64).reshape(-1)
                if p.shape != (b,):
                    raise ValueError(f"priorities shape {p.shape} != ({b},)")
                p = np.abs(p[b - n :])
                if not np.all(np.isfinite(p)):
                    raise ValueError("priorities must be finite")
                new_max = max(new_max, float(p.max()))
                vals = self._leaf_values(p)
        if self._storage is None:
            self._storage = {
                k: np.zeros((self.capacity, *np.shape(v)[1:]), dtype=np.asarray(v).dtype)
                for k, v in items.items()
            }
        # Items beyond capacity would be overwritten within this same call, so
        # write only the newest n but advance the cursor as if all b were.
        start = (self._cursor + b - n) % self.capacity
        first = min(n, self.capacity - start)
        for k, v in items.items():
            src = np.asarray(v)[b - n :]
            dst = self._storage[k]
            dst[start : start + first] = src[:first]
            dst[: n - first] = src[first:]
        pos = (start + np.arange(n)) % self.capacity
        self._gen[pos] += 1
        self._cursor = (self._cursor + b) % self.capacity
        self._size = min(self.capacity, self._size + b)
        if vals is not None:
            self._max_priority = new_max
            self._tree.update(pos, vals)

    def _add_frames(self, msg: dict[str, np.ndarray], priorities, columns: list[str]
                    ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """Write a framed message's frames, each column's to its ring; its items with absolute refs (and their
        oldest frame per ring), and their priorities. Checks come first, so a bad message changes nothing."""
        refs, keys = {c: _ref_keys(c) for c in columns}, {c: _message_keys(c) for c in columns}
        missing = [k for c in columns for k in (*keys[c], *refs[c][:2]) if k not in msg]
        if missing:
            raise ValueError(f"a framed message needs {sorted(missing)}")
        # Each ring reads its frames under the bare keys, as a flat observation's message holds them.
        subs = {c: msg if c == FLAT else dict(zip(MESSAGE_KEYS, (msg[k] for k in keys[c]))) for c in columns}
        framing = {k for ks in keys.values() for k in ks}
        items = {k: np.asarray(v) for k, v in msg.items() if k not in framing}
        b = self._validate({**items, **{old: items[ref] for ref, _, old in refs.values()}})
        p = None if priorities is None else np.asarray(priorities, np.float64).reshape(-1)
        if p is not None and (p.shape != (b,) or not np.all(np.isfinite(p))):
            raise ValueError(f"priorities must be {b} finite values, got shape {p.shape}")
        for c, (ref, nxt, _) in refs.items():
            both, ring = np.concatenate([items[ref], items[nxt]]), self._frames.get(c)
            if both.size and (both.min() < 0 or both.max() >= len(subs[c][FRAMES])):
                raise ValueError(f"frame refs of {c!r} out of range")
            if ring is not None and not ring.fits(subs[c]):
                raise ValueError(f"frames of {c!r} differ in shape, dtype or stack size from the stored ones")
        keep = True
        for c, (ref, nxt, old) in refs.items():
            ring = self._frames.get(c) or self._new_ring(c, subs[c])
            to_abs = ring.write(subs[c])
            self._evict_stale(c)
            items[ref], items[nxt] = to_abs[items[ref]], to_abs[items[nxt]]
            items[old] = ring.oldest(items[ref])
            keep = keep & (items[old] >= ring.horizon)  # only a message larger than the ring loses some
        if keep.all():
            return items, p
        return {k: v[keep] for k, v in items.items()}, None if p is None else p[keep]

    def _new_ring(self, column: str, sub: dict) -> FrameRing:
        """A column's ring, for frames like the message's: a frame per item and two stacks of slack."""
        frames, stack = np.asarray(sub[FRAMES]), int(np.asarray(sub[STACK]).reshape(-1)[0])
        self._frames[column] = FrameRing(self.capacity + 2 * max(1, stack), frames.shape[1:], frames.dtype, stack)
        return self._frames[column]

    def _evict_stale(self, column: str) -> None:
        """Evict the oldest items through the last one reading a frame of ``column`` before its ring's horizon.

        Next-stack refs grow along the FIFO; a stale item's message started less than ``link_age`` after
        its oldest frame, so every stale item lies among those whose next ref is below the bound.
        """
        if self._size == 0:
            return
        ring, (_, nxt_key, old_key) = self._frames[column], _ref_keys(column)
        horizon = ring.horizon
        bound = horizon + ring.link_age + ring.max_message
        nxt, first = self._storage[nxt_key], (self._cursor - self._size) % self.capacity
        lo, hi = 0, self._size
        while lo < hi:  # binary search over the FIFO: O(log n) lookups per add
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if nxt[(first + mid) % self.capacity] < bound else (lo, mid)
        stale = np.flatnonzero(self._storage[old_key][self._live(lo)] < horizon)
        if stale.size:
            self._drop_oldest(int(stale[-1]) + 1)

    def _drop_oldest(self, n: int) -> None:
        """Evict the n oldest items: no mass, and a new generation so late priority updates miss them."""
        pos = self._live(n)
        self._gen[pos] += 1
        if self._tree is not None:
            self._tree.update(pos, 0.0)
        self._size -= n

    # --------------------------------------------------------------- sample
    def sample(self, batch_size: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """One batch: (items incl. ``"_generation"``, indices, float32 weights)."""
        batch, idx, w = self.sample_many(1, batch_size)
        return {k: tree.index(v, 0) for k, v in batch.items()}, idx[0], w[0]

    def sample_many(
        self, num_batches: int, batch_size: int
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """``num_batches`` independent batches, arrays shaped (num_batches, batch_size, ...).

        Each batch counts as one sample call for beta annealing and its
        weights are normalised by its own max.
        """
        if self._size == 0 or self._storage is None:
            raise ValueError("cannot sample from an empty buffer")
        if num_batches < 1 or batch_size < 1:
            raise ValueError("num_batches and batch_size must be >= 1")
        shape = (num_batches, batch_size)
        if self._tree is None:
            idx = self._rng.integers(0, self._size, size=shape, dtype=np.int64)
            if self._size < self.capacity:  # the live items end at the cursor
                idx = (idx + self._cursor - self._size) % self.capacity
            weights = np.ones(shape, dtype=np.float32)
        else:
            betas = self._beta_at(self._sample_count + np.arange(num_batches))
            idx, weights = stratified_sample(self._tree, self._rng, self._size, num_batches, batch_size, betas)
        self._sample_count += num_batches
        batch = {k: v[idx] for k, v in self._storage.items()}
        for c, ring in self._frames.items():  # "obs" and "next_obs" of a flat observation, or "obs.<key>"...
            ref, nxt, old = _ref_keys(c)
            batch[c], batch["next_" + c] = ring.stacks(batch.pop(ref)), ring.stacks(batch.pop(nxt))
            del batch[old]
        batch[GENERATION_KEY] = self._gen[idx]
        return tree.from_columns(batch), idx, weights

    def update_priorities(
        self,
        indices: np.ndarray,
        priorities: np.ndarray,
        generations: np.ndarray | None = None,
    ) -> None:
        """Set raw priorities (|TD|); entries for evicted slots or stale generations are skipped."""
        if self._tree is None:
            return
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        p = np.abs(np.asarray(priorities, dtype=np.float64).reshape(-1))
        if p.shape != idx.shape:
            raise ValueError(f"priorities shape {p.shape} != indices shape {idx.shape}")
        if not np.all(np.isfinite(p)):
            raise ValueError("priorities must be finite")
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            raise IndexError(f"index out of range [0, {self.capacity})")
        keep = (idx - self._cursor + self._size) % self.capacity < self._size  # live slots only
        if self._size == self.capacity:
            keep[:] = True
        if generations is not None:
            gen = np.asarray(generations, dtype=np.int64).reshape(-1)
            if gen.shape != idx.shape:
                raise ValueError(f"generations shape {gen.shape} != indices shape {idx.shape}")
            keep &= gen == self._gen[idx]
        idx, p = idx[keep], p[keep]
        if idx.size == 0:
            return
        self._max_priority = max(self._max_priority, float(p.max()))
        self._tree.update(idx, self._leaf_values(p))

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Snapshot made of numpy arrays and python scalars only (arrays copied): the live items in slot
        order (until the ring wraps, slots [0, size)), the generations of every slot written, and each
        frame ring of a framed replay under its frames key ("frames" for a flat observation's)."""
        rng = self._rng.bit_generator.state
        live = np.sort(self._live())
        written = self.capacity if self._gen[self._cursor:].any() else self._cursor
        state: dict[str, Any] = {
            "capacity": self.capacity,
            "prioritized": self.prioritized,
            "cursor": self._cursor,
            "size": self._size,
            "sample_count": self._sample_count,
            "max_priority": self._max_priority,
            "generations": self._gen[:written].copy(),
            "priorities": (
                self._tree.get(live) if self._tree is not None
                else np.zeros(0, dtype=np.float64)
            ),
            # PCG64 state is two 128-bit ints plus a cached 32-bit half-draw.
            "rng_state": int(rng["state"]["state"]),
            "rng_inc": int(rng["state"]["inc"]),
            "rng_has_uint32": int(rng["has_uint32"]),
            "rng_uinteger": int(rng["uinteger"]),
        }
        for k, v in (self._storage or {}).items():
            state[_STORAGE_PREFIX + k] = v[live]
        for c, ring in self._frames.items():
            state[framed_key(FRAMES, c)] = ring.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` snapshot (capacity and mode must match)."""
        if int(state["capacity"]) != self.capacity or bool(state["prioritized"]) != self.prioritized:
            raise ValueError("state_dict capacity/prioritized mismatch")
        self._cursor = int(state["cursor"])
        self._size = int(state["size"])
        live = np.sort(self._live())
        storage = {k[len(_STORAGE_PREFIX):]: _scattered(v, live, self.capacity)
                   for k, v in state.items() if k.startswith(_STORAGE_PREFIX)}
        self._storage = storage or None
        self._frames = {c: FrameRing.from_state(state[framed_key(FRAMES, c)]) for c in framed_columns(state)}
        self._sample_count = int(state["sample_count"])
        self._max_priority = float(state["max_priority"])
        gen = np.asarray(state["generations"], np.int64)
        self._gen = _scattered(gen, np.arange(len(gen)), self.capacity)
        if self._tree is not None:
            self._tree.set_all(_scattered(np.asarray(state["priorities"], np.float64), live, self.capacity))
        self._rng.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": int(state["rng_state"]), "inc": int(state["rng_inc"])},
            "has_uint32": int(state["rng_has_uint32"]),
            "uinteger": int(state["rng_uinteger"]),
        }


@functools.cache
def _ref_keys(column: str) -> tuple[str, str, str]:
    """A framed column's item keys: its obs ref, next-obs ref and oldest frame."""
    return framed_key(OBS_REF, column), framed_key(NEXT_REF, column), framed_key(OLDEST_KEY, column)


@functools.cache
def _message_keys(column: str) -> tuple[str, ...]:
    """A framed column's message keys (`MESSAGE_KEYS`)."""
    return tuple(framed_key(k, column) for k in MESSAGE_KEYS)


def _scattered(rows: np.ndarray, slots: np.ndarray, capacity: int) -> np.ndarray:
    """A capacity-long array with ``rows`` at ``slots`` (a ring buffer's saved slots), zeros elsewhere."""
    out = np.zeros((capacity, *np.shape(rows)[1:]), dtype=np.asarray(rows).dtype)
    out[slots] = rows
    return out
