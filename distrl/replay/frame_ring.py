"""The replay's half of frames stored once: a ring of frames with their links (see `distrl.replay.frames`).

Frames are numbered by an absolute counter (``count`` frames ever written); frame i sits in slot
``i % capacity`` with the absolute index of the frame before it in its stack (or itself when it
repeats, -1 for zeros). A message's frames are appended in order, so a frame is overwritten
exactly ``capacity`` frames after it was written: the frames from ``horizon = count - capacity`` on
are alive. Items hold the absolute index of their stacks' newest frames; an item is alive while its
oldest frame is (`oldest`); the replay evicts the others before they can be read.

Joining fragments. Each message's chain of an env starts with its first stack in full. When the
same stream's previous chain ended with a stack equal to it bit for bit (still alive, and no more
than ``link_age`` frames old so the replay's search for stale items stays short), that stack is
reused: the message's copy is not written and the rest of the chain links to it. So a step costs
one frame whatever the fragment length.

A ring of single frames (``stack`` 0: a structured observation's image leaf) holds stacks of one and gives
each as its frame, without a stack axis.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from distrl.replay.frames import (CHAIN_HEAD, CHAIN_KEY, CHAIN_TAIL, FRAMES, KINDS, PREV, SELF, STACK,
                                  local_links, stack_indices, take_stacks)


class FrameRing:
    """A ring of ``capacity`` frames of one shape and dtype, stacks of ``stack`` frames (0: single frames),
    streams' last stacks."""

    def __init__(self, capacity: int, frame_shape: tuple, dtype, stack: int):
        self.capacity, self.stack = int(capacity), int(stack)
        self.k = max(1, self.stack)  # frames per stack
        if capacity < 2 * self.k:
            raise ValueError(f"a frame ring of {capacity} frames cannot hold two stacks of {self.k}")
        self.frames = np.zeros((self.capacity, *frame_shape), dtype)
        self.links = np.full(self.capacity, -1, np.int64)
        self.count = 0         # frames ever written
        self.max_message = 0   # the most frames one message wrote (bounds the replay's stale-item search)
        self.streams: dict[int, tuple[int, int]] = {}  # stream key -> (last stack's newest frame, its oldest)

    @property
    def link_age(self) -> int:
        """How old (in frames) a stream's last stack may be for a new chain to link to it."""
        return self.capacity // 8

    @property
    def horizon(self) -> int:
        """The oldest frame still in the ring."""
        return max(0, self.count - self.capacity)

    @property
    def nbytes(self) -> int:
        return int(self.frames.nbytes + self.links.nbytes)

    @property
    def live_nbytes(self) -> int:
        """Bytes of the slots holding written frames."""
        return self.nbytes * min(self.count, self.capacity) // self.capacity

    def fits(self, msg: dict) -> bool:
        """Does a message's frames match this ring's shape, dtype and stack size?"""
        f = np.asarray(msg[FRAMES])
        return f.shape[1:] == self.frames.shape[1:] and f.dtype == self.frames.dtype \
            and int(np.asarray(msg[STACK]).reshape(-1)[0]) == self.stack

    def indices(self, newest: np.ndarray) -> np.ndarray:
        """(..., k) absolute frame indices of the stacks ending at ``newest`` (-1: zeros)."""
        return stack_indices(self.links, newest, self.k, self.capacity)

    def stacks(self, newest: np.ndarray) -> np.ndarray:
        """The stacks ending at ``newest`` (...,), rebuilt: (..., stack, *frame); single frames (..., *frame)."""
        if not self.stack:
            return np.take(self.frames, np.asarray(newest) % self.capacity, axis=0)
        return take_stacks(self.frames, self.indices(newest), self.capacity)

    def oldest(self, newest: np.ndarray) -> np.ndarray:
        """The oldest frame each stack ending at ``newest`` reads."""
        idx = self.indices(newest)
        return np.where(idx >= 0, idx, np.iinfo(np.int64).max).min(axis=-1)

    # ---------------------------------------------------------------- write
    def write(self, msg: dict) -> np.ndarray:
        """Append a message's frames (joining chains to their streams); each message frame's absolute
        index (-2 for the frames a join made redundant, which no item references)."""
        frames, kinds = np.asarray(msg[FRAMES]), np.asarray(msg[KINDS])
        keys, heads, tails = (np.asarray(msg[k], np.int64) for k in (CHAIN_KEY, CHAIN_HEAD, CHAIN_TAIL))
        joined = self._joins(keys, heads, frames, kinds)
        keep = np.ones(len(frames), bool)
        starts = np.concatenate([[0], tails[:-1] + 1])
        for e in np.flatnonzero(joined >= 0):  # per env chain, not per item
            keep[starts[e]:heads[e] + 1] = False
        to_abs = np.where(keep, self.count + np.cumsum(keep) - 1, -2)
        to_abs[heads[joined >= 0]] = joined[joined >= 0]
        ids = np.flatnonzero(keep)
        kept_kinds = kinds[ids]
        links = np.where(kept_kinds == PREV, to_abs[np.maximum(ids - 1, 0)],
                         np.where(kept_kinds == SELF, to_abs[ids], -1))
        self._append(frames if keep.all() else frames[ids], links)
        if len(tails):
            ends = to_abs[tails]
            for key, end, old in zip(keys.tolist(), ends.tolist(), self.oldest(ends).tolist()):
                self.streams[key] = (end, old)
        h = self.horizon
        self.streams = {k: v for k, v in self.streams.items() if v[1] >= h}
        return to_abs

    def _joins(self, keys, heads, frames, kinds) -> np.ndarray:
        """Per chain: the absolute newest frame of its stream's last stack when the chain's first stack
        equals it and it stays alive through this write; else -1."""
        out = np.full(len(keys), -1, np.int64)
        floor = max(self.count + len(frames) - self.capacity, self.count - self.link_age, 0)
        cand = [(e, self.streams[k][0]) for e, k in enumerate(keys.tolist())
                if k in self.streams and self.streams[k][1] >= floor]
        if not cand:
            return out
        es, ends = (np.array(x, np.int64) for x in zip(*cand))
        mine = take_stacks(frames, stack_indices(local_links(kinds), heads[es], self.k))
        theirs = take_stacks(self.frames, self.indices(ends), self.capacity)  # (n, k, *frame), as mine
        same = (mine == theirs).reshape(len(es), -1).all(axis=1) if mine.dtype == np.uint8 else \
            (mine.view(np.uint8) == theirs.view(np.uint8)).reshape(len(es), -1).all(axis=1)
        out[es[same]] = ends[same]
        return out

    def _append(self, frames: np.ndarray, links: np.ndarray) -> None:
        """Write frames (and their links) at the ring's cursor; only the newest ``capacity`` if more."""
        n = len(frames)
        self.max_message = max(self.max_message, n)
        skip = max(0, n - self.capacity)
        start = (self.count + skip) % self.capacity
        first = min(n - skip, self.capacity - start)
        for dst, src in ((self.frames, frames), (self.links, links)):
            dst[start:start + first] = src[skip:skip + first]
            dst[:n - skip - first] = src[skip + first:]
        self.count += n

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The live frames (oldest first) and links, counters and streams: arrays and ints only."""
        live = np.arange(self.horizon, self.count) % self.capacity
        keys = np.array(list(self.streams), np.int64)
        ends = np.array([v for v in self.streams.values()], np.int64).reshape(-1, 2)
        return {"capacity": self.capacity, "stack": self.stack, "count": self.count,
                "max_message": self.max_message, "frames": self.frames[live], "links": self.links[live],
                "stream_keys": keys, "stream_ends": ends}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "FrameRing":
        frames = np.asarray(state["frames"])
        ring = cls(int(state["capacity"]), frames.shape[1:], frames.dtype, int(state["stack"]))
        ring.count, ring.max_message = int(state["count"]), int(state["max_message"])
        live = np.arange(ring.horizon, ring.count) % ring.capacity
        ring.frames[live], ring.links[live] = frames, state["links"]
        ends = np.asarray(state["stream_ends"], np.int64).reshape(-1, 2).tolist()
        ring.streams = dict(zip(np.asarray(state["stream_keys"], np.int64).tolist(), map(tuple, ends)))
        return ring
