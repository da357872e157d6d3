"""What moves in and out of the learner while it trains: the next block of batches, made ready on the
learner's device by a thread (`BlockFeeder`), and snapshots of its weights, published by another
(`WeightPublisher`). Neither makes the training thread wait for the device or for another process.

On a GPU, a block is copied through pinned host memory on a stream of its own, and a snapshot of the
weights is copied out the same way; the training stream only waits on an event. On the CPU the same code
runs with the copies and events left out (a block's arrays become tensors without a copy).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from distrl import tree
from distrl.core import Weights
from distrl.replay.store import Block


@dataclass
class ReadyBlock:
    """A block as replay gave it (`host`: for priorities, versions and generations) and its batches and
    importance weights ready for the learner's device (`batches`, `weights`: tensors on a GPU, the host's
    arrays on the CPU, which each update takes as tensors without a copy)."""

    host: Block
    batches: dict[str, Any]
    weights: Any
    ready: Any = None  # the CUDA event the copies recorded; the training stream waits on it

    @property
    def size(self) -> int:
        return tree.rows(next(iter(self.host[0].values())))

    def wait(self) -> None:
        if self.ready is not None:
            import torch

            torch.cuda.current_stream().wait_event(self.ready)


def on_device(block: Block, device: str, stream=None) -> ReadyBlock:
    """`block`'s arrays made ready for `device`: on the CPU as they are (a batch's numpy view becomes a
    tensor without a copy in `update`, cheaper than slicing a tensor); on a GPU pinned, then copied without
    blocking on `stream` (uint8 frames stay uint8: the network makes them floats there)."""
    import torch

    batches, _, weights = block
    if not device.startswith("cuda"):
        return ReadyBlock(block, batches, weights)
    with torch.cuda.stream(stream):
        to_device = lambda v: torch.from_numpy(np.ascontiguousarray(v)).pin_memory().to(device, non_blocking=True)  # noqa: E731
        moved = {k: tree.map(to_device, v)
                 for k, v in ({**batches, "_weights": weights} if weights is not None else batches).items()}
        event = torch.cuda.Event()
        event.record()
    main = torch.cuda.current_stream(device)
    for t in tree.leaves(list(moved.values())):
        t.record_stream(main)  # made on the copy stream, freed only once the training stream is done with it
    w = moved.pop("_weights", None)
    return ReadyBlock(block, moved, w, event)


class BlockFeeder:
    """Asks for blocks and makes them ready on the learner's device. With a `pool` (one thread), asking
    for a block, waiting for it (another process's answer) and its copy happen on that thread while the
    learner trains on the one before; without, on the caller's thread when taken (single mode: the store
    lives in this process and the driver adds to it between learner calls)."""

    def __init__(self, request: Callable[[int], Any], receive: Callable[[Any], Block | None], device: str,
                 pool: ThreadPoolExecutor | None):
        self.request, self.receive, self.device, self.pool = request, receive, device, pool
        self.stream = None
        if device.startswith("cuda"):
            import torch

            self.stream = torch.cuda.Stream(device)
        self.pending: tuple[int, Future] | None = None  # (updates asked, the block on its way)

    def _fetch(self, max_updates: int) -> ReadyBlock | None:
        block = self.receive(self.request(max_updates))
        return None if block is None else on_device(block, self.device, self.stream)

    def ask(self, max_updates: int) -> None:
        """Start bringing the next block (at most `max_updates` batches), unless one is on its way."""
        if self.pool is not None and self.pending is None:
            self.pending = (max_updates, self.pool.submit(self._fetch, max_updates))

    def take(self, max_updates: int) -> ReadyBlock | None:
        """The next block, at most `max_updates` batches of it (None: the store had nothing): the one on its
        way if there is one, else one asked for now."""
        if self.pending is None:
            if self.pool is None:
                return self._fetch(max_updates)
            self.ask(max_updates)
        _, future = self.pending
        self.pending = None
        ready = future.result()
        if ready is not None and ready.size > max_updates:  # asked before this call's budget was known
            ready = _first(ready, max_updates)
        return ready

    def drop(self) -> None:
        """Forget the block on its way (the learner is being restored: the store may have changed)."""
        if self.pending is not None:
            self.pending[1].cancel()
            self.pending = None


def _first(ready: ReadyBlock, n: int) -> ReadyBlock:
    """The first `n` batches of a block (the rest were sampled, never trained on, and count for nothing)."""
    batches, indices, weights = ready.host
    host = ({k: tree.index(v, slice(n)) for k, v in batches.items()}, None if indices is None else indices[:n],
            None if weights is None else weights[:n])
    return ReadyBlock(host, {k: tree.index(v, slice(n)) for k, v in ready.batches.items()},
                      None if ready.weights is None else ready.weights[:n], ready.ready)


class WeightPublisher:
    """Publishes snapshots of the learner's weights. A snapshot is copied out of the weights on the
    training thread (on a GPU: into pinned memory, on a stream of its own, without waiting for it); a
    thread then checks it is finite and hands it to `send`. The buffer a snapshot is in is not written
    again until `send` returned, so what is sent is always one whole version. While one snapshot is still
    being sent, the next is taken only when asked with `wait` (newer ones replace it anyway)."""

    def __init__(self, module_state: Callable[[], dict], send: Callable[[int, Weights, bool], None], device: str,
                 threaded: bool):
        self.module_state, self.send, self.device = module_state, send, device
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="distrl-publish") if threaded else None
        self.stream = None
        if device.startswith("cuda"):
            import torch

            self.stream = torch.cuda.Stream(device)
        self.buffers: dict[str, Any] | None = None
        self.sending: Future | None = None
        self.poisoned = False  # a snapshot held a NaN or inf: it was not sent
        self.last_s = time.monotonic()
        self.sent_version = -1

    def busy(self) -> bool:
        return self.sending is not None and not self.sending.done()

    def publish(self, version: int, restored: bool = False, wait: bool = False) -> bool:
        """Snapshot the weights as `version` and send them; False if skipped (still sending the last one,
        and not `wait`). `wait`: also until this one has been sent (or found not finite)."""
        if self.busy() and not wait:
            return False
        self.settle()
        weights, ready = self._snapshot()
        self.last_s = time.monotonic()
        if self.pool is None:
            self._send(version, weights, ready, restored)
        else:
            self.sending = self.pool.submit(self._send, version, weights, ready, restored)
            if wait:
                self.settle()
        return True

    def settle(self) -> None:
        """Wait until the snapshot being sent has been sent (its errors are raised here)."""
        sending, self.sending = self.sending, None
        if sending is not None:
            sending.result()

    def _snapshot(self) -> tuple[Weights, Any]:
        import torch

        state = self.module_state()
        if self.pool is None:  # sent before this returns, and kept by whoever it was sent to: new arrays
            return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}, None
        if self.buffers is None or self.buffers.keys() != state.keys():
            pin = self.stream is not None
            self.buffers = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=pin) for k, v in state.items()}
        if self.stream is None:
            with torch.no_grad():
                for k, v in state.items():
                    self.buffers[k].copy_(v)
            return {k: b.numpy() for k, b in self.buffers.items()}, None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the step that made these weights
        with torch.cuda.stream(self.stream), torch.no_grad():
            for k, v in state.items():
                self.buffers[k].copy_(v, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        return {k: b.numpy() for k, b in self.buffers.items()}, event

    def _send(self, version: int, weights: Weights, ready, restored: bool) -> None:
        if ready is not None:
            ready.synchronize()  # this thread waits for the copy, not the training one
        if not all(np.isfinite(v).all() for v in weights.values() if v.dtype.kind == "f"):
            self.poisoned = True
            return
        self.send(version, weights, restored)
        self.sent_version = version

    def due(self, interval_s: float | None) -> bool:
        """Whether `interval_s` seconds have passed since the last snapshot."""
        return interval_s is not None and time.monotonic() - self.last_s >= interval_s
