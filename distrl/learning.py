"""The learner's side of the data path, shared by every mode.

Off-policy algorithms sample blocks of batches from a replay buffer;
on-policy ones take fragments from a FIFO, each used for exactly one update.
`next_block` hides the difference from the learner loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from distrl.algos import data_path
from distrl.core import Learner
from distrl.replay import FragmentQueue, ReplayBuffer

Block = tuple[dict[str, np.ndarray], np.ndarray | None, np.ndarray | None]
"""(batches with a leading K axis, replay indices or None, importance weights or None)."""


@dataclass
class TrainStats:
    """What one block of updates reports to the driver."""

    updates: int = 0   # optimizer updates that happened
    consumed: int = 0  # batches handed to the learner (> updates when A3C drops stale gradients)
    dropped: int = 0
    loss_sum: float = 0.0
    lags: list[float] = field(default_factory=list)
    learner_s: float = 0.0
    wait_s: float = 0.0
    version: int = 0
    starved: bool = False  # the store had nothing to give
    scalars: dict[str, list[float]] = field(default_factory=dict)  # name -> [sum, count] of learner stats

    def add_scalars(self, out: dict) -> None:
        """Sum the learner's scalar diagnostics (alpha, entropy, KL, ...) for the driver's log."""
        for k, v in out.items():
            if k not in NOT_LOGGED and isinstance(v, (float, int, np.floating, np.integer)) \
                    and not isinstance(v, bool) and math.isfinite(v):
                add_to_sums(self.scalars, k, float(v), 1)


def add_to_sums(sums: dict[str, list[float]], name: str, total: float, count: int) -> None:
    """sums[name] = [sum, count], accumulated: means taken later need both."""
    acc = sums.setdefault(name, [0.0, 0])
    acc[0] += total
    acc[1] += count


# Already metrics.csv columns, or running totals whose per-interval mean means nothing.
NOT_LOGGED = {"loss", "dropped", "dropped_total", "policy_lag", "optimizer_steps"}


def make_store(cfg) -> ReplayBuffer | FragmentQueue:
    if data_path(cfg.algo) != "replay":
        return FragmentQueue(cfg.queue.capacity)
    r = cfg.replay
    return ReplayBuffer(r.capacity, r.prioritized, r.alpha, r.beta0, r.beta_steps, seed=cfg.seed)


def store_nbytes(store) -> int:
    if isinstance(store, FragmentQueue):
        return sum(v.nbytes for item in store.state_dict()["items"] for v in item.values())
    return store.nbytes


def fragments_per_update(cfg) -> int:
    """On-policy batch size in fragments: one per worker unless the config says otherwise."""
    if data_path(cfg.algo) == "gradients":
        return 1  # each gradient message is applied on its own
    if cfg.learner.fragments_per_update:
        return cfg.learner.fragments_per_update
    return 1 if cfg.mode == "single" else cfg.workers


def next_block(store, cfg, max_updates: int) -> Block | None:
    """The next data to train on, or None if there is none yet."""
    if isinstance(store, FragmentQueue):
        batch = store.take(fragments_per_update(cfg))
        return None if batch is None else ({k: v[None] for k, v in batch.items()}, None, None)
    if len(store) == 0:
        return None
    lc = cfg.learner
    return store.sample_many(min(lc.batches_per_call, max(max_updates, 1)), lc.batch_size)


def learn_block(learner: Learner, block: Block, stats: TrainStats) -> np.ndarray | None:
    """One `update` per batch in the block; return (K, B) priorities if the learner gave any.

    Policy lag of a batch = learner updates so far - mean version of its data,
    where a version is the learner's update count when those weights were published.
    """
    batches, _, weights = block
    k = next(iter(batches.values())).shape[0]
    priorities = None
    for i in range(k):
        batch = {key: v[i] for key, v in batches.items()}
        if weights is not None:
            batch["weights"] = weights[i]
        stats.lags.append(float(learner.updates - batch["version"].mean()))
        out = learner.update(batch)
        stats.consumed += 1
        if out.get("dropped"):
            stats.dropped += 1
        else:
            stats.updates += 1
        stats.loss_sum += float(out.get("loss", 0.0))
        stats.add_scalars(out)
        if "priorities" in out:
            if priorities is None:
                priorities = np.empty((k, len(out["priorities"])), np.float64)
            priorities[i] = out["priorities"]
    return priorities


def write_priorities(store, block: Block, priorities: np.ndarray | None) -> None:
    _, indices, _ = block
    if priorities is not None and indices is not None:
        store.update_priorities(indices.ravel(), priorities.ravel(), block[0]["_generation"].ravel())
