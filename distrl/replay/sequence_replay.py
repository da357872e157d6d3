"""Server side of sequence replay: a chunk store whose items reference slices of chunks.

Messages from `SequenceAdder` (see `distrl.replay.sequences` for how episodes are cut and where
burn-in sits) carry chunks of one episode's steps, each sent once, and items naming up to K chunks
by key plus where their window lies in them. A chunk occupies one slot of preallocated ``(slots,
chunk_length, ...)`` arrays; an item slot holds only its chunk slots, offset, padding, length,
first flag, recurrent state and version. So steps are stored once and overlapping items share them.

Chunk slots count the items referencing them. ``capacity`` bounds the stored steps (real lengths
of live chunks): before a message's new chunks are written, the oldest items are evicted (FIFO,
from a ring) until they fit, and a chunk is freed onto a free list once its refcount is zero.
Chunks the incoming items reference are pinned first, so making room never frees them. An item
whose chunks are not all present (one was freed before it arrived) is dropped and counted in
``dropped_items``; chunks only dropped items use are not kept.

Both slot arrays are allocated from the first message's shapes and grow by a sixteenth when they
run out (short chunks at episode ends; the item count depends on the period, which the server is
not told). Growth re-lays the item ring from slot 0, so an item's generation is its serial number:
a priority update applies only if the slot still holds the item that was sampled.

Stacked frames: a field sent as ``frames/<name>`` (M, chunk_length + k - 1, ...) holds a chunk's first
stack then one frame per step (`distrl.replay.sequences`); its batches carry step i's stack, frames
``[i, i + k)`` of the chunk, gathered with one take like every field.

Sampling is proportional to ``priority ** alpha`` over item slots with `SumTree` (stratified,
importance weights normalised by each batch's max, beta annealed like `ReplayBuffer`) or uniform
over the ring. Batches are gathered time-major ``(L, B, ...)`` with one flat take per field: item
i's stored steps sit at ``[pad_left, pad_left + length)``, the rest is zero padding.
"""
from __future__ import annotations

import numpy as np

from distrl.replay.buffer import GENERATION_KEY
from distrl.replay.sequence_state import SequenceState
from distrl.replay.sequences import chunks_per_item
from distrl.replay.sumtree import SumTree, stratified_sample

_CHUNK, _FRAMES = "chunk/", "frames/"
_META = ("chunk/key", "chunk/length")
_ITEM_KEYS = ("item/chunks", "item/offset", "item/pad_left", "item/length", "item/first", "item/state", "version")
_BATCH_KEYS = {"valid", "first", "state", "version", GENERATION_KEY}
_MISSING = np.iinfo(np.int64).min


class SequenceReplay(SequenceState):
    """Prioritized (or uniform) replay of sequence items over shared, refcounted chunks; ``capacity``
    counts stored steps and ``sequence_length`` is L = burn_in + length + n_step."""

    def __init__(self, capacity: int, sequence_length: int, prioritized: bool = True, alpha: float = 0.6,
                 beta0: float = 0.4, beta_steps: int = 100_000, eps: float = 1e-6, seed: int = 0) -> None:
        if capacity < 1 or sequence_length < 1:
            raise ValueError("capacity and sequence_length must be >= 1")
        self.capacity, self.sequence_length = int(capacity), int(sequence_length)
        self.prioritized, self.beta_steps = bool(prioritized), max(1, int(beta_steps))
        self.alpha, self.beta0, self.eps = float(alpha), float(beta0), float(eps)
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._clear()

    def _clear(self) -> None:
        """No storage yet, counters at zero."""
        self.dropped_items = self._sample_count = self._stored = 0
        self._max_priority, self._chunk_length = 1.0, 0
        self._data: dict[str, np.ndarray] | None = None  # field -> (chunk slots, chunk_length, ...)
        self._chunk: dict[str, np.ndarray] = {}          # per slot: "key" (-1 when free), "length", "refs"
        self._free: list[int] = []                       # a stack: the end is reused first
        self._slot_of: dict[int, int] = {}
        self._items: dict[str, np.ndarray] = {}          # the item ring; "serial" is -1 when free
        self._head = self._size = self._serial = 0
        self._tree: SumTree | None = None
        self._stacks: dict[str, int] = {}    # fields kept as frames -> their stack size
        self._msg_keys: dict[str, str] = {}  # field -> its key in messages

    def __len__(self) -> int:
        return self._size

    @property
    def stored_steps(self) -> int:
        """Steps held by live chunks (what ``capacity`` bounds)."""
        return self._stored

    @property
    def num_chunks(self) -> int:
        """Live chunks."""
        return len(self._slot_of)

    @property
    def beta(self) -> float:
        """Importance-sampling exponent used by the next sample call."""
        return float(self._beta_at(self._sample_count))

    @property
    def nbytes(self) -> int:
        """Bytes held by the chunk and item storage arrays (allocated slots, live or free)."""
        arrays = [*(self._data or {}).values(), *self._chunk.values(), *self._items.values()]
        return int(sum(a.nbytes for a in arrays))

    checkpoint_nbytes = nbytes  # an upper bound: a checkpoint writes the live chunks and items only

    def chunk_refcounts(self) -> dict[int, int]:
        """Live chunk keys and how many stored items reference each."""
        return {k: int(self._chunk["refs"][s]) for k, s in self._slot_of.items()}

    def _beta_at(self, count):
        return self.beta0 + (1.0 - self.beta0) * np.minimum(1.0, np.asarray(count, np.float64) / self.beta_steps)

    def _leaf_values(self, p: np.ndarray) -> np.ndarray:
        return (np.abs(p).astype(np.float64) + self.eps) ** self.alpha

    def _ring(self, n: int, start: int = 0) -> np.ndarray:
        """Item slots of the items start .. start + n - 1, oldest first."""
        return (self._head + start + np.arange(n)) % len(self._items["serial"])

    # ------------------------------------------------------------------ add
    def add(self, message: dict, priorities: np.ndarray | None = None) -> None:
        """Store a message's new chunks and its items (with these priorities, or the max so far)."""
        n = self._validate(message)
        p = self._priorities(priorities, n)
        ref, keep = self._resolve(message)
        self.dropped_items += int(n - keep.sum())
        ref = ref[keep]
        np.add.at(self._chunk["refs"], ref[ref >= 0], 1)  # pinned: making room cannot free them
        is_new = ref <= -2
        new = np.unique(-2 - ref[is_new])
        lengths = np.asarray(message["chunk/length"], np.int64)[new]
        self._evict(self._stored + int(lengths.sum()) - self.capacity)
        slots = self._write_chunks(message, new, lengths)
        ref[is_new] = slots[np.searchsorted(new, -2 - ref[is_new])]
        np.add.at(self._chunk["refs"], ref[is_new], 1)
        self._insert(ref, {k: np.asarray(message[k])[keep] for k in _ITEM_KEYS[1:]},
                     None if p is None else p[keep])
        self._evict(self._stored - self.capacity)  # only a message larger than capacity gets here

    def _validate(self, msg: dict) -> int:
        """Check a message's keys, shapes and windows (allocating storage from the first); its N."""
        fields = {k[len(_CHUNK):]: np.asarray(v) for k, v in msg.items() if k.startswith(_CHUNK) and k not in _META}
        framed = {k[len(_FRAMES):]: np.asarray(v) for k, v in msg.items() if k.startswith(_FRAMES)}
        missing = [k for k in (*_META, *_ITEM_KEYS) if k not in msg]
        if missing or not fields or _BATCH_KEYS & {*fields, *framed} or set(fields) & set(framed):
            raise ValueError(f"bad sequence message: missing {missing}, fields {sorted(fields)} {sorted(framed)}")
        c = next(iter(fields.values())).shape[1]
        if any(v.ndim < 2 or v.shape[1] < c for v in framed.values()):
            raise ValueError(f"frames/ fields need at least chunk_length={c} frames per chunk")
        self._msg_keys = {**{k: _CHUNK + k for k in fields}, **{k: _FRAMES + k for k in framed}}
        fields.update(framed)
        spec = lambda arrays: {k: (v.shape[1:], v.dtype) for k, v in arrays.items()}
        state = np.asarray(msg["item/state"])
        if self._data is not None and (spec(fields) != spec(self._data)
                                       or state.shape[1:] != self._items["state"].shape[1:]):
            raise ValueError("chunk fields or item/state differ from the stored ones")
        lengths, m = np.asarray(msg["chunk/length"]), len(msg["chunk/key"])
        if any(len(v) != m for v in fields.values()) or lengths.shape != (m,) or np.any((lengths < 1) | (lengths > c)):
            raise ValueError("chunk arrays disagree on M or lengths are out of range")
        n = self._check_windows(msg, c)
        if self._data is None:
            self._allocate(fields, state, stacks={k: v.shape[1] - c + 1 for k, v in framed.items()})
        return n

    def _check_windows(self, msg: dict, c: int) -> int:
        keys, n = np.asarray(msg["item/chunks"]), len(msg["version"])
        if keys.shape != (n, chunks_per_item(self.sequence_length, c)) or any(len(msg[k]) != n for k in _ITEM_KEYS):
            raise ValueError(f"item arrays must have N={n} rows and item/chunks (N, K)")
        touched = (keys != -1).sum(axis=1)
        off, pad, length = (np.asarray(msg[k], np.int64) for k in ("item/offset", "item/pad_left", "item/length"))
        if np.any(keys < -1) or np.any(touched < 1) or np.any(keys[np.arange(n), np.maximum(touched - 1, 0)] == -1) \
                or np.any(off < 0) or np.any(length < 1) or np.any(off + length > touched * c) \
                or np.any(pad < 0) or np.any(pad + length > self.sequence_length):
            raise ValueError("item windows are out of range")
        return n

    def _priorities(self, priorities, n: int) -> np.ndarray | None:
        p = None if priorities is None or self._tree is None else np.abs(np.asarray(priorities, np.float64).ravel())
        if p is not None and (p.shape != (n,) or not np.all(np.isfinite(p))):
            raise ValueError(f"priorities must be {n} finite values, got shape {p.shape}")
        return p

    def _resolve(self, msg: dict) -> tuple[np.ndarray, np.ndarray]:
        """Item chunk refs as slots (>= 0), -1 padding, or -2 - i for new chunk i; and the items to keep."""
        new_of: dict[int, int] = {}
        for i, k in enumerate(np.asarray(msg["chunk/key"]).tolist()):
            new_of.setdefault(k, i)

        def code(k: int) -> int:
            if k == -1:
                return -1
            if k in self._slot_of:  # already stored: a resent chunk's data is ignored
                return self._slot_of[k]
            return -2 - new_of[k] if k in new_of else _MISSING

        keys = np.asarray(msg["item/chunks"], np.int64)
        uniq, inv = np.unique(keys, return_inverse=True)
        ref = np.array([code(k) for k in uniq.tolist()], np.int64)[inv.reshape(keys.shape)]
        return ref, ~np.any(ref == _MISSING, axis=1)

    def _write_chunks(self, msg: dict, new: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Copy new chunks ``new`` (message rows) into free slots; their slots."""
        if len(self._free) < new.size:
            self._grow_chunks(new.size - len(self._free))
        slots = np.array(self._free[len(self._free) - new.size:][::-1], np.int64)
        del self._free[len(self._free) - new.size:]
        for name, arr in self._data.items():
            arr[slots] = np.asarray(msg[self._msg_keys[name]])[new]
        keys = np.asarray(msg["chunk/key"], np.int64)[new]
        self._chunk["key"][slots], self._chunk["length"][slots] = keys, lengths
        self._slot_of.update(zip(keys.tolist(), slots.tolist()))
        self._stored += int(lengths.sum())
        return slots

    def _insert(self, ref: np.ndarray, items: dict[str, np.ndarray], p: np.ndarray | None) -> None:
        n = len(ref)
        if self._size + n > len(self._items["serial"]):
            self._grow_items(self._size + n)
        pos = self._ring(n, self._size)
        self._items["chunks"][pos] = ref
        for k, v in items.items():
            self._items[k.removeprefix("item/")][pos] = v
        self._items["serial"][pos] = self._serial + np.arange(n)
        self._serial += n
        self._size += n
        if self._tree is not None and n:
            if p is not None:
                self._max_priority = max(self._max_priority, float(p.max()))
            self._tree.update(pos, self._leaf_values(np.full(n, self._max_priority) if p is None else p))

    # ------------------------------------------------------------- eviction
    def _evict(self, excess: int) -> None:
        """Evict the fewest oldest items whose chunks free at least ``excess`` steps (all if none do)."""
        m = min(self._size, 64)
        while excess > 0 and m > 0:
            refs = self._items["chunks"][self._ring(m)]
            used = refs >= 0
            owner = np.broadcast_to(np.arange(m)[:, None], refs.shape)[used]
            uniq, inv, counts = np.unique(refs[used], return_inverse=True, return_counts=True)
            last = np.zeros(uniq.size, np.int64)
            np.maximum.at(last, inv, owner)
            # Evicting items [0, last] frees a chunk iff they hold all of its references.
            gone = counts == self._chunk["refs"][uniq]
            freed = np.cumsum(np.bincount(last[gone], weights=self._chunk["length"][uniq[gone]], minlength=m))
            i = int(np.searchsorted(freed, excess))
            if i < m or m == self._size:
                return self._pop(min(i + 1, m))
            m = min(self._size, 2 * m)

    def _pop(self, n: int) -> None:
        """Evict the n oldest items and free the chunks no item references any more."""
        pos = self._ring(n)
        refs = self._items["chunks"][pos]
        refs = refs[refs >= 0]
        np.subtract.at(self._chunk["refs"], refs, 1)
        touched = np.unique(refs)
        freed = touched[self._chunk["refs"][touched] == 0]
        for k in self._chunk["key"][freed].tolist():
            del self._slot_of[k]
        self._stored -= int(self._chunk["length"][freed].sum())
        self._chunk["key"][freed], self._chunk["length"][freed] = -1, 0
        self._free.extend(freed[::-1].tolist())
        self._items["serial"][pos] = -1
        if self._tree is not None:
            self._tree.update(pos, 0.0)
        self._head = (self._head + n) % len(self._items["serial"])
        self._size -= n

    # -------------------------------------------------------------- storage
    def _allocate(self, fields: dict[str, np.ndarray], state: np.ndarray, chunk_slots: int | None = None,
                  item_slots: int | None = None, stacks: dict[str, int] | None = None) -> None:
        """Empty storage shaped like these chunk fields (M, C, ...), of which ``stacks`` are frames (M, C + k - 1,
        ...) rebuilt into stacks of k, and item states (N, ...)."""
        self._stacks = dict(stacks or {})
        c = self._chunk_length = int(next(v for k, v in fields.items() if k not in self._stacks).shape[1])
        n = chunk_slots if chunk_slots is not None else -(-self.capacity // c) + 1
        self._data = {k: np.zeros((n, *v.shape[1:]), v.dtype) for k, v in fields.items()}
        self._chunk = {"key": np.full(n, -1, np.int64), "length": np.zeros(n, np.int64), "refs": np.zeros(n, np.int64)}
        self._free = list(range(n - 1, -1, -1))
        m = item_slots if item_slots is not None else max(16, -(-self.capacity // self.sequence_length))
        k = chunks_per_item(self.sequence_length, c)
        self._items = {"chunks": np.full((m, k), -1, np.int32), "offset": np.zeros(m, np.int32),
                       "pad_left": np.zeros(m, np.int32), "length": np.zeros(m, np.int32),
                       "first": np.zeros(m, bool), "state": np.zeros((m, *state.shape[1:]), np.float32),
                       "version": np.zeros(m, np.int32), "serial": np.full(m, -1, np.int64)}
        self._tree = SumTree(m) if self.prioritized else None

    def _grow_chunks(self, need: int) -> None:
        old = len(self._chunk["key"])
        new = old + max(need, old // 16 + 16)
        self._data = {k: _extend(v, new, 0) for k, v in self._data.items()}
        self._chunk = {k: _extend(v, new, -1 if k == "key" else 0) for k, v in self._chunk.items()}
        self._free[:0] = range(new - 1, old - 1, -1)

    def _grow_items(self, need: int) -> None:
        """Re-lay the ring from slot 0 in larger arrays (and a larger tree)."""
        old = len(self._items["serial"])
        new = max(need, old + old // 16 + 16)
        pos = self._ring(self._size)
        self._items = {k: _extend(v[pos], new, -1 if k in ("chunks", "serial") else 0) for k, v in self._items.items()}
        self._head = 0
        if self._tree is not None:
            self._tree, leaves = SumTree(new), np.concatenate([self._tree.get(pos), np.zeros(new - self._size)])
            self._tree.set_all(leaves)

    # --------------------------------------------------------------- sample
    def sample_many(self, num_batches: int, batch_size: int) -> tuple[dict, np.ndarray, np.ndarray]:
        """``num_batches`` time-major batches (K, L, B, ...), item slots (K, B), weights (K, B)."""
        if self._size == 0 or num_batches < 1 or batch_size < 1:
            raise ValueError(f"cannot sample {num_batches} x {batch_size} from {self._size} items")
        shape = (num_batches, batch_size)
        if self._tree is None:
            idx = (self._head + self._rng.integers(0, self._size, size=shape)) % len(self._items["serial"])
            weights = np.ones(shape, np.float32)
        else:
            betas = self._beta_at(self._sample_count + np.arange(num_batches))
            idx, weights = stratified_sample(self._tree, self._rng, self._size, num_batches, batch_size, betas)
        self._sample_count += num_batches
        return self._gather(idx), idx, weights

    def _gather(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Time-major windows of the items at slots ``idx`` (K, B)."""
        it = {k: self._items[k][idx][:, None, :] for k in ("offset", "pad_left", "length", "first")}
        p = np.arange(self.sequence_length)[None, :, None] - it["pad_left"]  # (K, L, B): step within the item
        valid = (p >= 0) & (p < it["length"])
        j, r = np.divmod(np.where(valid, it["offset"] + p, 0), self._chunk_length)
        slot = self._items["chunks"][idx[:, None, :], j].astype(np.int64)
        flat = np.where(valid, slot * self._chunk_length + r, 0)
        batch = {}
        for name, arr in self._data.items():
            k = self._stacks.get(name)
            at = flat if k is None else (slot * arr.shape[1] + np.where(valid, r, 0))[..., None] + np.arange(k)
            batch[name] = np.take(arr.reshape(-1, *arr.shape[2:]), at, axis=0)
            batch[name][~valid] = 0
        batch["valid"] = valid.astype(np.float32)
        batch["first"] = (p == 0) & it["first"]
        batch["state"] = self._items["state"][idx]
        batch["version"] = self._items["version"][idx]
        batch[GENERATION_KEY] = self._items["serial"][idx]
        return batch

    def update_priorities(self, indices, priorities, generations=None) -> None:
        """Set raw priorities by item slot; entries for slots freed or reused since sampling are skipped."""
        if self._tree is None:
            return
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        p = np.abs(np.asarray(priorities, dtype=np.float64).reshape(-1))
        gen = None if generations is None else np.asarray(generations, dtype=np.int64).reshape(-1)
        if p.shape != idx.shape or (gen is not None and gen.shape != idx.shape):
            raise ValueError(f"priorities/generations shapes differ from indices shape {idx.shape}")
        if not np.all(np.isfinite(p)):
            raise ValueError("priorities must be finite")
        serial = self._items["serial"]
        if idx.size and (idx.min() < 0 or idx.max() >= len(serial)):
            raise IndexError(f"index out of range [0, {len(serial)})")
        keep = serial[idx] >= 0 if gen is None else serial[idx] == gen  # a freed slot keeps zero mass
        idx, p = idx[keep], p[keep]
        if idx.size:
            self._max_priority = max(self._max_priority, float(p.max()))
            self._tree.update(idx, self._leaf_values(p))


def _extend(a: np.ndarray, n: int, fill) -> np.ndarray:
    """``a`` with its first axis grown to n rows, the new ones ``fill``."""
    out = np.full((n, *a.shape[1:]), fill, a.dtype)
    out[:len(a)] = a
    return out
