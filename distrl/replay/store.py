"""The experience store of a data path, and what the learner takes from it.

Off-policy algorithms sample blocks of batches from a replay buffer;
on-policy ones take fragments from a FIFO, each used for exactly one update.
`next_block` hides the difference from the learner loop. How much a gather brings
and how much an update takes depend on the run mode: the runtime decides
(`distrl.runtime.pacing`) and hands the result down.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from distrl import tree

from distrl.replay.buffer import GENERATION_KEY, ReplayBuffer
from distrl.replay.fifo import FragmentQueue
from distrl.replay.sequence_replay import SequenceReplay

Store = ReplayBuffer | SequenceReplay | FragmentQueue

Block = tuple[dict[str, np.ndarray], np.ndarray | None, np.ndarray | None]
"""(batches with a leading K axis, replay indices or None, importance weights or None)."""


def make_store(data_path: str, replay=None, queue_capacity: int = 0, sequence_length: int = 0,
               seed: int = 0) -> Store:
    """The store of a data path: `replay` (a ReplayConfig) for "replay" and "sequence" (items of
    `sequence_length` steps), a FIFO of `queue_capacity` fragments otherwise."""
    r = replay
    if data_path == "replay":
        return ReplayBuffer(r.capacity, r.prioritized, r.alpha, r.beta0, r.beta_steps, seed=seed)
    if data_path == "sequence":
        return SequenceReplay(r.capacity, sequence_length, r.prioritized, r.alpha, r.beta0, r.beta_steps, seed=seed)
    return FragmentQueue(queue_capacity)


@dataclass
class Take:
    """What the learner takes per request: `batches_per_call` batches of `batch_size` items from a replay,
    or `fragments` fragments (one update's batch) from a FIFO."""

    batch_size: int = 256
    batches_per_call: int = 8
    fragments: int = 1


def next_block(store: Store, take: Take, max_updates: int) -> Block | None:
    """The next data to train on, or None if there is none yet."""
    if isinstance(store, FragmentQueue):
        batch = store.take(take.fragments)
        return None if batch is None else ({k: tree.index(v, None) for k, v in batch.items()}, None, None)
    if len(store) == 0:
        return None
    return store.sample_many(min(take.batches_per_call, max(max_updates, 1)), take.batch_size)


def block_priority_update(block: Block, priorities: np.ndarray | None):
    """(indices, priorities, generations) to send back to replay after training on `block`, or None."""
    batches, indices, _ = block
    if priorities is None or indices is None:
        return None
    keep = np.isfinite(priorities.ravel())  # NaN rows: updates skipped for a non-finite loss
    return indices.ravel()[keep], priorities.ravel()[keep], batches[GENERATION_KEY].ravel()[keep]


def digest(tree) -> str | None:
    """sha256 over a store state's arrays in key order: equal digests mean equal replay contents."""
    if tree is None:
        return None
    h = hashlib.sha256()
    _digest_into(h, tree, "")
    return h.hexdigest()


def _digest_into(h, node, prefix: str) -> None:
    if isinstance(node, np.ndarray):
        h.update(prefix.encode())
        h.update(str(node.dtype).encode())
        h.update(np.ascontiguousarray(node).data)  # no bytes copy of a big array
    elif isinstance(node, dict):
        for k in sorted(node):
            _digest_into(h, node[k], f"{prefix}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _digest_into(h, v, f"{prefix}/{i}")
