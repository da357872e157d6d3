"""Bounded FIFO of trajectory fragments for on-policy learners (and A3C gradients)."""
from __future__ import annotations

from collections import deque

import numpy as np

from distrl import tree


class FragmentQueue:
    """Fragments in arrival order. The producer side is held back when full (backpressure).

    `take(k)` hands the k oldest fragments to the learner as one batch,
    concatenated along axis 1 (the env axis of time-major (T, E, ...) arrays).
    """

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._items: deque[dict[str, np.ndarray]] = deque()
        self.added = 0
        self.taken = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes held by the queued fragments' arrays."""
        return sum(tree.nbytes(v) for item in self._items for v in item.values())

    checkpoint_nbytes = nbytes  # a checkpoint writes every queued fragment

    def add(self, items: dict[str, np.ndarray], priorities=None) -> None:
        """Accepts past capacity: the driver enforces the bound by not relaunching workers."""
        self._items.append(items)
        self.added += 1

    def take(self, k: int) -> dict[str, np.ndarray] | None:
        if len(self._items) < k:
            return None
        frags = [self._items.popleft() for _ in range(k)]
        self.taken += k
        if k == 1:
            return frags[0]
        return {key: tree.concatenate([f[key] for f in frags], axis=1) for key in frags[0]}

    def state_dict(self) -> dict:
        return {"items": list(self._items), "added": self.added, "taken": self.taken}

    def load_state_dict(self, state: dict) -> None:
        self._items = deque(state["items"])
        self.added, self.taken = int(state["added"]), int(state["taken"])
