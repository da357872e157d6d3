"""The learner's job without its process: blocks of updates, when to publish, the learner's state.

`LearnerLoop` is the one learner loop of every mode. Where its data comes from
and where its weights go is a `LearnerIO`: `LocalIO` (single mode: the store
and the policy live in this process) or the Ray actor's (`distrl.runtime.actors`).
"""
from __future__ import annotations

import abc
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from distrl import tree
from distrl.core import Learner, TrainStats, Weights
from distrl.envs.normalize import SharedStatistics
from distrl.observe.trace import tracer
from distrl.replay.store import Block, block_priority_update
from distrl.roles.transfer import BlockFeeder, ReadyBlock, WeightPublisher, on_device
from distrl.threads import ThreadChoice, torch_threads


def learn_block(learner: Learner, block: Block | ReadyBlock, stats: TrainStats) -> np.ndarray | None:
    """One `update` per batch in the block (as replay gave it, or made ready on the learner's device),
    then their outputs read back from the device at once; return (K, B) priorities if the learner gave
    any (NaN rows: updates that took no step).

    Policy lag of a batch = learner updates so far - mean version of its data,
    where a version is the learner's update count when those weights were published.
    """
    ready = block if isinstance(block, ReadyBlock) else on_device(block, "cpu")
    ready.wait()
    host = ready.host[0]
    k = ready.size
    if "version" in host:  # a dataset's items were made by no weights: no lag
        versions = np.asarray(host["version"], np.float64).reshape(k, -1).mean(axis=1)
        stats.lags.extend((learner.updates + np.arange(k) - versions).tolist())
    outs = []
    for i in range(k):
        batch = {key: tree.index(v, i) for key, v in ready.batches.items()}
        if ready.weights is not None:
            batch["weights"] = ready.weights[i]
        outs.append(learner.update(batch))
    outs, unread_skips = read_back(outs)
    learner.uncount(unread_skips)
    priorities = None
    for i, out in enumerate(outs):
        stats.consumed += 1
        if out.get("nonfinite"):  # no step was taken: nothing to log or to send back to replay
            stats.nonfinite += 1
            stats.nonfinite_tail += 1
            continue
        stats.nonfinite_tail = 0
        if out.get("dropped"):
            stats.dropped += 1
        else:
            stats.updates += 1
        stats.loss_sum += float(out.get("loss", 0.0))
        stats.add_scalars(out)
        if "priorities" in out:
            if priorities is None:
                priorities = np.full((k, len(out["priorities"])), np.nan)  # NaN rows: skipped updates
            priorities[i] = out["priorities"]
    return priorities


def update_once(learner: Learner, batch) -> dict[str, Any]:
    """One `update` outside a block (tools, tests), its outputs read back and its count settled."""
    outs, unread_skips = read_back([learner.update(batch)])
    learner.uncount(unread_skips)
    return outs[0]


def read_back(outs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """A block's update outputs with every tensor among them copied to the host in one transfer (one wait
    for the device per block, not one per value): 0-d tensors as floats, others as float32 arrays. Also
    how many updates reported `nonfinite` as a tensor: their learner could not know and counted them."""
    import torch

    found = [(i, key, v) for i, out in enumerate(outs) for key, v in out.items() if torch.is_tensor(v)]
    if not found:
        return outs, 0
    if all(v.device.type == "cpu" for _, _, v in found):  # nothing to wait for: each value as it is
        values = [v.detach().numpy().astype(np.float32, copy=False).reshape(-1) for _, _, v in found]
    else:
        flat = torch.cat([v.detach().reshape(-1).float() for _, _, v in found]).cpu().numpy()
        ends = np.cumsum([v.numel() for _, _, v in found])
        values = np.split(flat, ends[:-1])
    outs, skips = [dict(out) for out in outs], 0
    for (i, key, v), value in zip(found, values):
        outs[i][key] = value.reshape(v.shape) if v.dim() else float(value[0])
        skips += key == "nonfinite" and bool(outs[i][key])
    return outs, skips


def all_finite(weights: Weights) -> bool:
    return all(np.isfinite(v).all() for v in weights.values())


class LearnerIO(abc.ABC):
    """Where a learner loop's blocks come from and where its priorities and weights go."""

    @abc.abstractmethod
    def request(self, max_updates: int) -> Any:
        """Ask for the next block; the answer may travel while the learner trains."""

    @abc.abstractmethod
    def receive(self, handle: Any) -> Block | None:
        """The block a `request` asked for (None: the store had nothing)."""

    @abc.abstractmethod
    def write_priorities(self, indices: np.ndarray, priorities: np.ndarray, generations: np.ndarray) -> None:
        """New priorities for replayed items."""

    @abc.abstractmethod
    def publish(self, version: int, weights: Weights, restored: bool = False) -> None:
        """Make `weights` the newest for workers and the evaluator; `restored`: even if `version` is
        lower than one published before (the learner went back to a checkpoint)."""

    overlaps: bool = False
    """Its blocks come from and its weights go to other processes: fetching and sending can run on
    threads beside the training (a store in this process is added to between learner calls)."""

    def flush(self, wait: bool = True) -> None:
        """Wait until every priority write and publication has landed (`wait` False: forget those that
        have, without waiting for the others)."""


class LearnerLoop:
    """Runs blocks of updates, publishes every `publish_interval` updates or `publish_interval_s` seconds,
    and saves and restores the learner with its RNG. `prefetch`: the next block is brought (and made
    ready on the learner's device) while this one trains (replay; on-policy data must come from the
    newest weights). `continuous`: calls follow one another without the driver waiting on them (async
    mode): the next block is asked for across calls, and a call returns without waiting for its
    publications and priority writes to land. Otherwise every call ends with the newest weights
    published and landed (a sync round's broadcast pull sees them, and sync runs are deterministic).
    `statistics`: the run's env.normalize statistics, merged from the workers' fragments
    (`add_statistics`) and published inside the weights.
    """

    def __init__(self, learner: Learner, io: LearnerIO, publish_interval: int, prefetch: bool,
                 publish_interval_s: float | None = None, continuous: bool = False,
                 threads: ThreadChoice | None = None):
        self.learner, self.io, self.threads = learner, io, threads
        self.publish_interval, self.publish_interval_s = publish_interval, publish_interval_s
        self.prefetch, self.continuous = prefetch, continuous
        device = str(getattr(learner, "device", "cpu"))
        # One thread asks for blocks, receives them and sends priorities back: the training thread only
        # trains (each of those is a call to another process, a millisecond or more of its time).
        self.io_thread = ThreadPoolExecutor(1, thread_name_prefix="distrl-learner-io") if io.overlaps else None
        self.feeder = BlockFeeder(io.request, io.receive, device, self.io_thread if prefetch else None)
        self.statistics = SharedStatistics()
        self.publisher = WeightPublisher(self.published_state, io.publish, device, threaded=io.overlaps)
        self.version = -1
        self.poisoned = False

    def add_statistics(self, new: dict | None) -> None:
        """Merge statistics workers recorded (they go out with the next weights)."""
        self.statistics.merge(new)

    def published_state(self) -> dict:
        """What a publication sends: the learner's weights and, with env.normalize, the run's statistics."""
        state = self.learner.weight_tensors()
        if not self.statistics.parts:
            return state
        import torch

        return {**state, **{k: torch.as_tensor(v) for k, v in self.statistics.arrays().items()}}

    def publish(self, restored: bool = False, wait: bool = True) -> int:
        """Snapshot the newest weights and send them out (`wait`: until they are sent), unless one of them
        is NaN or inf (then `poisoned`, and nothing is sent). Without `wait` a snapshot is skipped while the
        one before is still being sent (a later one carries newer weights)."""
        version = self.learner.updates
        with tracer().span("publish", "transfer", version=version):
            sent = self.publisher.publish(version, restored, wait)
            if sent:
                tracer().flow_out("weights", version)
        self.poisoned |= self.publisher.poisoned
        if sent and not self.publisher.poisoned:
            self.version = version
        return self.version

    def _publish_due(self) -> bool:
        unpublished = self.learner.updates - self.version
        return unpublished >= self.publish_interval or (unpublished > 0 and self.publisher.due(self.publish_interval_s))

    def train(self, num_updates: int) -> TrainStats:
        """Up to `num_updates` updates; stops early when the store has nothing to give."""
        stats = TrainStats()
        t_start = time.perf_counter()
        threads = self.threads.threads() if self.threads is not None else None
        if threads is not None:
            torch_threads(threads)
        while stats.consumed < num_updates:
            t0 = time.perf_counter()
            with tracer().span("wait_batch", "wait"):
                ready = self.feeder.take(num_updates - stats.consumed)
            stats.wait_s += time.perf_counter() - t0
            if ready is None:
                stats.starved = True  # the driver then lets workers sample even if updates lag
                break
            left = num_updates - stats.consumed - ready.size
            if self.prefetch and (left > 0 or self.continuous):
                self.feeder.ask(left if left > 0 else ready.size)  # the next block travels while this one trains
            with tracer().span("update_block", "learning", updates=ready.size):
                update = block_priority_update(ready.host, learn_block(self.learner, ready, stats))
            if update is not None:
                self._write_priorities(update)
            if self._publish_due():
                self.publish(wait=False)
        if not self.continuous:
            if self.learner.updates != self.version:
                self.publish()
            self.publisher.settle()
            self.flush()
        elif self.io_thread is not None:  # what landed is forgotten, on the thread that waits on the others
            self.io_thread.submit(self.io.flush, False)
        self.poisoned |= self.publisher.poisoned
        stats.version, stats.poisoned = self.version, self.poisoned
        stats.learner_s = time.perf_counter() - t_start - stats.wait_s
        if threads is not None:
            self.threads.record(threads, stats.learner_s, stats.consumed)
            torch_threads(1)  # what samples between calls in this process runs on one
        return stats

    def _write_priorities(self, update: tuple) -> None:
        if self.io_thread is None:
            self.io.write_priorities(*update)
        else:
            self.io_thread.submit(self.io.write_priorities, *update)

    def get_state(self) -> dict[str, Any] | None:
        """The learner's state and RNG for a checkpoint; None when its weights are not finite (never saved)."""
        import torch

        if self.poisoned or not all_finite(self.learner.get_weights()):
            self.poisoned = True
            return None
        statistics = {k: torch.as_tensor(v) for k, v in self.statistics.arrays().items()}
        return {"state": self.learner.state_dict(), "torch_rng": torch.get_rng_state(), "version": self.version,
                "statistics": statistics}

    def set_state(self, state: dict[str, Any]) -> int:
        """Restore the learner and its RNG, then publish its weights: they replace whatever was published,
        even weights of a later version that died with a previous learner process."""
        import torch

        self.feeder.drop()  # sampled for the learner being replaced
        self.publisher.settle()
        self.learner.load_state_dict(state["state"])
        torch.set_rng_state(state["torch_rng"])
        self.statistics.load({k: np.asarray(v) for k, v in state.get("statistics", {}).items()})
        version = self.publish(restored=True)
        self.flush()
        return version

    def flush(self) -> None:
        """Wait until every priority write and publication so far has landed: on the IO thread, after the
        writes queued there (Ray's calls of this process stay on one thread beside the training)."""
        if self.io_thread is None:
            self.io.flush()
        else:
            self.io_thread.submit(self.io.flush).result()


class LocalIO(LearnerIO):
    """Single mode: blocks come straight from the replay job in this process, weights go to its policy."""

    def __init__(self, experience, policy):
        self.experience, self.policy = experience, policy
        self.published: tuple[Weights | None, int] = (None, -1)  # the newest weights sent out, and their version

    def request(self, max_updates: int):
        return max_updates  # sampled on receive: nothing to overlap with in one process

    def receive(self, handle: int) -> Block | None:
        return self.experience.next_block(handle)

    def write_priorities(self, indices, priorities, generations) -> None:
        self.experience.update_priorities(indices, priorities, generations)

    def publish(self, version: int, weights: Weights, restored: bool = False) -> None:
        self.policy.set_weights(weights, version)
        self.published = (weights, version)
