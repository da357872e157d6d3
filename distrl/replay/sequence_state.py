"""The checkpoint form of `SequenceReplay` and what its storage costs per stored step."""
from __future__ import annotations

from typing import Any

import numpy as np


class SequenceState:
    """`SequenceReplay`'s state_dict / load_state_dict (numpy arrays and python scalars, no pickle) and
    its memory accounting; mixed into the replay, whose storage attributes it reads."""

    @property
    def bytes_per_item(self) -> float:
        """Real bytes per stored step: the slots of live chunks (frames and steps; a short chunk holds a
        whole slot) and their bookkeeping, plus the live items' share of the item ring and sum tree."""
        if self._data is None or self._stored == 0:
            return 0.0
        slots, ring = len(self._chunk["key"]), len(self._items["serial"])
        per_chunk = sum(a.nbytes for a in (*self._data.values(), *self._chunk.values())) / slots
        per_item = sum(a.nbytes for a in self._items.values()) / ring
        per_item += self._tree.nbytes / ring if self._tree is not None else 0
        return (self.num_chunks * per_chunk + self._size * per_item) / self._stored

    def state_dict(self) -> dict[str, Any]:
        """Live chunks and items with their slots, counters and RNG: numpy arrays and python scalars."""
        state: dict[str, Any] = {
            "capacity": self.capacity, "sequence_length": self.sequence_length, "prioritized": self.prioritized,
            "counters": np.array([len(self._chunk.get("key", ())), len(self._items.get("serial", ())), self._head,
                                  self._size, self._serial, self._stored, self.dropped_items, self._sample_count]),
            "max_priority": np.array([self._max_priority]),
            "rng": self._rng.bit_generator.state,  # nested dict of str and (128-bit) ints
        }
        if self._data is not None:
            live = np.flatnonzero(self._chunk["key"] >= 0)
            take = _rows(live)
            state["chunks"] = {"slot": live, "free": np.array(self._free, np.int64),
                               "data": {k: v[take] for k, v in self._data.items()},
                               "key": self._chunk["key"][take], "length": self._chunk["length"][take]}
            if self._stacks:  # fields kept as frames, and their stack sizes (plain ints)
                state["chunks"]["stacks"] = dict(self._stacks)
            pos = self._ring(self._size)
            state["items"] = {k: v[pos] for k, v in self._items.items()}
            if self._tree is not None:
                state["items"]["priority"] = self._tree.get(pos)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict` snapshot (capacity, sequence_length and mode must match)."""
        if (int(state["capacity"]), int(state["sequence_length"]), bool(state["prioritized"])) != \
                (self.capacity, self.sequence_length, self.prioritized):
            raise ValueError("state_dict capacity/sequence_length/prioritized mismatch")
        chunk_slots, item_slots, head, size, serial, stored, dropped, count = (int(x) for x in state["counters"])
        self._clear()
        if "chunks" in state:
            ch, items = state["chunks"], state["items"]
            stacks = {k: int(v) for k, v in ch.get("stacks", {}).items()}
            self._allocate(ch["data"], items["state"], chunk_slots, item_slots, stacks)
            self._msg_keys = {k: ("frames/" if k in stacks else "chunk/") + k for k in ch["data"]}
            live = np.asarray(ch["slot"], np.int64)
            for k, v in ch["data"].items():
                self._data[k][live] = v
            self._chunk["key"][live], self._chunk["length"][live] = ch["key"], ch["length"]
            self._slot_of = dict(zip(self._chunk["key"][live].tolist(), live.tolist()))
            self._free = np.asarray(ch["free"], np.int64).tolist()
            self._head, self._size = head, size
            pos = self._ring(size)
            for k, v in self._items.items():
                v[pos] = items[k]
            refs = self._items["chunks"][pos]
            np.add.at(self._chunk["refs"], refs[refs >= 0], 1)
            if self._tree is not None:
                self._tree.update(pos, np.asarray(items["priority"], np.float64))
        self._serial, self._stored, self.dropped_items, self._sample_count = serial, stored, dropped, count
        self._max_priority = float(state["max_priority"][0])
        self._rng.bit_generator.state = state["rng"]


def _rows(rows: np.ndarray) -> np.ndarray | slice:
    """An index for `rows` of an array: a slice (a view, no copy) when they are 0..n-1, as in a replay
    that never freed a slot or one with every slot live; a checkpoint of a large replay would otherwise
    copy its whole store first."""
    if rows.size and rows[0] == 0 and rows[-1] == rows.size - 1:
        return slice(0, rows.size)  # sorted and distinct (flatnonzero), so exactly 0..n-1
    return rows
