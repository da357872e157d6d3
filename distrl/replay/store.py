"""The experience store a run uses, and what the learner takes from it.

Off-policy algorithms sample blocks of batches from a replay buffer;
on-policy ones take fragments from a FIFO, each used for exactly one update.
`next_block` hides the difference from the learner loop.
"""
from __future__ import annotations

import hashlib

import numpy as np

from distrl.registry import data_path
from distrl.replay.buffer import GENERATION_KEY, ReplayBuffer
from distrl.replay.fifo import FragmentQueue
from distrl.replay.rate_limiter import RateLimiter
from distrl.replay.sequence_replay import SequenceReplay

Store = ReplayBuffer | SequenceReplay | FragmentQueue

Block = tuple[dict[str, np.ndarray], np.ndarray | None, np.ndarray | None]
"""(batches with a leading K axis, replay indices or None, importance weights or None)."""


def sequence_length(cfg) -> int:
    """Steps of a stored sequence: burn-in, trained steps, then n-step bootstrap steps."""
    seq = cfg.sequence
    return seq.burn_in + seq.length + getattr(cfg, cfg.algo).n_step


def make_store(cfg) -> Store:
    r, path = cfg.replay, data_path(cfg.algo)
    if path == "replay":
        return ReplayBuffer(r.capacity, r.prioritized, r.alpha, r.beta0, r.beta_steps, seed=cfg.seed)
    if path == "sequence":
        return SequenceReplay(r.capacity, sequence_length(cfg), r.prioritized, r.alpha, r.beta0, r.beta_steps,
                              seed=cfg.seed)
    return FragmentQueue(cfg.queue.capacity)


def items_per_gather(cfg) -> int:
    """Items one gather is expected to insert: every worker's fragment in sync mode, about one otherwise."""
    frag = cfg.rollout.fragment_length * cfg.env.num_envs
    if data_path(cfg.algo) == "sequence":
        frag = -(-frag // cfg.sequence.period)
    return frag * (cfg.workers if cfg.mode == "sync" else 1)


def error_buffer(cfg) -> float:
    """The rate limiter's buffer: the config's, or one gather of inserts plus one learner block."""
    if cfg.replay.error_buffer is not None:
        return cfg.replay.error_buffer
    lc = cfg.learner
    return cfg.replay.samples_per_insert * items_per_gather(cfg) + lc.batch_size * lc.batches_per_call


def make_rate_limiter(cfg, inserts: int = 0, samples: int = 0, exact: bool = False) -> RateLimiter:
    """The run's limiter at these counts; `exact` drops the buffer (for ending a run on the ratio)."""
    r = cfg.replay
    return RateLimiter(r.samples_per_insert, r.min_size, 0.0 if exact else error_buffer(cfg), inserts, samples)


def fragments_per_update(cfg) -> int:
    """On-policy batch size in fragments: one per worker unless the config says otherwise."""
    if data_path(cfg.algo) == "gradients":
        return 1  # each gradient message is applied on its own
    if cfg.learner.fragments_per_update:
        return cfg.learner.fragments_per_update
    return 1 if cfg.mode == "single" else cfg.workers


def next_block(store: Store, cfg, max_updates: int) -> Block | None:
    """The next data to train on, or None if there is none yet."""
    if isinstance(store, FragmentQueue):
        batch = store.take(fragments_per_update(cfg))
        return None if batch is None else ({k: v[None] for k, v in batch.items()}, None, None)
    if len(store) == 0:
        return None
    lc = cfg.learner
    return store.sample_many(min(lc.batches_per_call, max(max_updates, 1)), lc.batch_size)


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
