"""Array-backed binary sum tree with vectorised batch update and search."""

from __future__ import annotations

import numpy as np


def stratified_sample(tree: "SumTree", rng: np.random.Generator, size: int, num_batches: int, batch_size: int,
                      betas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Proportional prioritized sampling: (indices, importance weights), both (num_batches, batch_size).

    Stratified: one uniform draw inside each of batch_size equal segments of the total
    priority. Weights (size * P(i))^-beta are normalised by each batch's max, in log
    space so tiny probabilities cannot overflow.
    """
    total = tree.total
    u = (np.arange(batch_size) + rng.random((num_batches, batch_size))) * (total / batch_size)
    idx = tree.find(u)
    probs = tree.get(idx) / total
    logw = -np.asarray(betas)[:, None] * np.log(size * probs)
    return idx, np.exp(logw - logw.max(axis=1, keepdims=True)).astype(np.float32)


class SumTree:
    """Binary sum tree over ``capacity`` non-negative leaves.

    Layout: one float64 array of size ``2 * L`` where ``L`` is the smallest
    power of two >= capacity; node 1 is the root, node ``i`` has children
    ``2i`` and ``2i + 1``, leaves live at ``[L, 2L)``. Padding leaves stay 0,
    so they can never be returned by :meth:`find`.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._leaf0 = 1 << max(0, (self.capacity - 1).bit_length())
        self._depth = self._leaf0.bit_length() - 1
        self._tree = np.zeros(2 * self._leaf0, dtype=np.float64)
        self._max = 0.0

    @property
    def total(self) -> float:
        """Sum of all leaves (the root)."""
        # A one-leaf tree has its leaf at node 1 == the root; that's consistent.
        return float(self._tree[1])

    @property
    def nbytes(self) -> int:
        """Bytes of the node array."""
        return int(self._tree.nbytes)

    @property
    def max_value(self) -> float:
        """Running maximum of every leaf value ever stored (never decreases).

        Values superseded by a later duplicate index in the same ``update``
        call are never stored and don't count. A running max is O(1) and is what prioritized replay wants for new
        items; it may exceed the current largest leaf.
        """
        return self._max

    def _check_indices(self, indices: np.ndarray) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            raise IndexError(f"leaf index out of range [0, {self.capacity})")
        return idx

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``indices`` to ``values``; duplicates: last one wins."""
        idx = self._check_indices(indices)
        vals = np.asarray(values, dtype=np.float64).reshape(-1)
        if vals.shape != idx.shape:
            vals = np.broadcast_to(vals, idx.shape)
        if idx.size == 0:
            return
        if not np.all(np.isfinite(vals)) or np.any(vals < 0):
            raise ValueError("SumTree values must be finite and >= 0")
        # np.unique on the reversed array keeps the first hit there, i.e. the
        # last occurrence in call order.
        uniq, first_rev = np.unique(idx[::-1], return_index=True)
        vals = vals[::-1][first_rev]
        nodes = uniq + self._leaf0
        self._tree[nodes] = vals
        self._max = max(self._max, float(vals.max()))
        # Recompute parents from both children instead of adding deltas, so
        # sums stay exact and round-off never accumulates across updates.
        # `nodes` stays sorted level by level, so dropping repeats needs no sort (np.unique sorts).
        for _ in range(self._depth):
            nodes = nodes >> 1
            nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]
            self._tree[nodes] = self._tree[2 * nodes] + self._tree[2 * nodes + 1]

    def set_all(self, values: np.ndarray) -> None:
        """Replace every leaf at once (rebuilds all levels)."""
        vals = np.asarray(values, dtype=np.float64).reshape(-1)
        if vals.shape != (self.capacity,):
            raise ValueError(f"expected {self.capacity} values, got {vals.shape}")
        if not np.all(np.isfinite(vals)) or np.any(vals < 0):
            raise ValueError("SumTree values must be finite and >= 0")
        self._tree[:] = 0.0
        self._tree[self._leaf0 : self._leaf0 + self.capacity] = vals
        lo = self._leaf0
        while lo > 1:
            hi, lo = lo, lo // 2
            self._tree[lo:hi] = self._tree[2 * lo : 2 * hi : 2] + self._tree[2 * lo + 1 : 2 * hi : 2]
        self._max = float(vals.max()) if vals.size else 0.0

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Leaf values at ``indices`` (same shape as ``indices``)."""
        arr = np.asarray(indices, dtype=np.int64)
        idx = self._check_indices(arr)
        return self._tree[idx + self._leaf0].reshape(arr.shape)

    def find(self, prefix_sums: np.ndarray) -> np.ndarray:
        """Leaf index ``i`` with ``cumsum(leaf[:i]) <= u < cumsum(leaf[:i+1])``.

        ``u`` is clamped into ``[0, total)``. The result always points to a
        leaf with a positive value and an index < capacity.
        """
        u_in = np.asarray(prefix_sums, dtype=np.float64)
        total = self._tree[1]
        if not total > 0.0:
            raise ValueError("cannot search an empty SumTree (total == 0)")
        u = np.clip(u_in.reshape(-1), 0.0, np.nextafter(total, 0.0))
        node = np.ones(u.shape, dtype=np.int64)
        for _ in range(self._depth):
            left = 2 * node
            lsum = self._tree[left]
            # Round-off can leave u >= left sum while the right subtree is
            # empty; going left then is the only way to stay on positive mass.
            # Since each parent == left + right exactly, a positive node always
            # has a positive child on the chosen side.
            go_left = (u < lsum) | (self._tree[left + 1] <= 0.0)
            u = np.where(go_left, u, u - lsum)
            node = np.where(go_left, left, left + 1)
        return (node - self._leaf0).reshape(u_in.shape)
