"""How the driver takes fragments from Ray workers: all of them (`sync`) or what is ready (`async`)."""
from __future__ import annotations

import time

import ray
from ray.exceptions import RayTaskError

from distrl.runtime.ray_setup import ACTOR_GONE


class CallTimeout(Exception):
    """A worker call outlived its time: the worker is treated as failed."""


def collect(refs: list, timeout_s: float | None = None) -> tuple[list, list]:
    """ray.get each ref; a failed worker call, or one not done within `timeout_s`, is reported, not raised."""
    ok, failed = [], []
    if timeout_s is not None and refs:
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        failed = [(ref, CallTimeout(f"no fragment within {timeout_s:.0f} s")) for ref in refs if ref not in done]
        refs = done
    for ref in refs:
        try:
            ok.append((ref, ray.get(ref)))
        except (*ACTOR_GONE, RayTaskError) as e:
            failed.append((ref, e))
    return ok, failed


class SyncGather:
    """All workers sample at once; the driver waits for every fragment and the learner."""

    waits_for_learner = True

    def __init__(self, workers, timeout_s: float):
        self.workers = workers
        self.timeout_s = timeout_s  # a worker silent for this long counts as failed
        self.held: set[int] = set()  # restarting workers: skipped until healthy

    def release(self, i: int) -> None:
        self.held.discard(i)

    def gather(self, allow_sampling: bool):
        """-> ([(info, data ref)], [(worker index, error)], ready, late)."""
        if not allow_sampling:
            return [], [], 0, 0
        calls = {}
        for i, w in enumerate(self.workers):
            if i not in self.held:
                info_ref, data_ref = w.sample.remote(True)
                calls[info_ref] = (i, data_ref)
        ok, failed = collect(list(calls), self.timeout_s)
        failed_workers = [(calls[ref][0], e) for ref, e in failed]
        self.held.update(i for i, _ in failed_workers)
        return [(info, calls[ref][1]) for ref, info in ok], failed_workers, len(ok), 0


class AsyncGather:
    """Workers run freely; take what finished within `window_s`, leave the rest running.

    Each worker has `depth` sample calls queued, so it starts its next fragment the
    moment it returns one instead of idling until the driver's next gather.
    """

    waits_for_learner = False

    def __init__(self, workers, window_s: float, depth: int = 2):
        self.workers = workers
        self.window_s = window_s
        self.depth = depth
        self.inflight: dict = {}  # info ref -> (worker index, data ref)
        self.free = [depth] * len(workers)  # call slots each worker has open
        self.held: set[int] = set()  # restarting workers get no calls until released

    def release(self, i: int) -> None:
        self.held.discard(i)
        self.free[i] = self.depth - sum(1 for j, _ in self.inflight.values() if j == i)

    def gather(self, allow_sampling: bool):
        """-> ([(info, data ref)], [(worker index, error)], ready, late)."""
        if allow_sampling:  # workers back off while the learner catches up (update-to-data ratio)
            for i in range(len(self.workers)):
                while self.free[i] > 0 and i not in self.held:
                    info_ref, data_ref = self.workers[i].sample.remote(False)
                    self.inflight[info_ref] = (i, data_ref)
                    self.free[i] -= 1
        if not self.inflight:
            time.sleep(self.window_s)
            return [], [], 0, 0
        ready, _ = ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=self.window_s)
        ok, failed = collect(ready)
        out = []
        for ref, info in ok:
            i, data_ref = self.inflight.pop(ref)
            self.free[i] += 1
            out.append((info, data_ref))
        failed_calls = [(self.inflight.pop(ref)[0], e) for ref, e in failed]
        self.held.update(i for i, _ in failed_calls)
        busy = {i for i, _ in self.inflight.values()}
        done = {info.worker for _, info in ok}
        return out, failed_calls, len(done), len(busy - done)
