"""How the driver takes fragments from Ray workers: all of them (`sync`) or what is ready (`async`).

Neither waits on a worker for longer than a second at a time: between waits the driver looks at its roles
(`WorkerPool.check`: restarted workers back); a hung worker is ended by the heartbeats' thread meanwhile,
and its call fails. A call that outlives `limit_s` (fault.worker_timeout_s, plus fault.role_timeout_s and
fault.start_timeout_s: a worker may wait that long on a role it calls being found hung and restarted) counts
as failed.
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import RayTaskError

from distrl.runtime.ray_setup import ACTOR_GONE

SLICE_S = 1.0


class CallTimeout(Exception):
    """A worker call outlived its time: the worker is treated as failed."""


def collect(refs: list) -> tuple[list, list]:
    """ray.get each (finished) ref; a failed worker call is reported, not raised."""
    ok, failed = [], []
    for ref in refs:
        try:
            ok.append((ref, ray.get(ref)))
        except (*ACTOR_GONE, RayTaskError) as e:
            failed.append((ref, e))
    return ok, failed


class SyncGather:
    """All workers sample at once; the driver waits for every fragment and the learner."""

    waits_for_learner = True

    def __init__(self, workers, limit_s: float):
        self.workers = workers
        self.limit_s = limit_s  # a call taking longer counts as failed
        self.held: set[int] = set()  # restarting workers: skipped until healthy

    def hold(self, i: int) -> None:
        self.held.add(i)

    def release(self, i: int) -> None:
        self.held.discard(i)

    def gather(self, allow_sampling: bool, between=lambda: None):
        """-> ([(info, data ref)], [(worker index, error)], ready, late); `between()` runs every second of
        waiting."""
        if not allow_sampling:
            return [], [], 0, 0
        calls, start = {}, time.time()
        for i, w in enumerate(self.workers):
            if i not in self.held:
                info_ref, data_ref = w.sample.remote(True)
                calls[info_ref] = (i, data_ref)
        waiting, done = list(calls), []
        while waiting and time.time() - start < self.limit_s:
            ready, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=SLICE_S)
            done += ready
            if waiting:
                between()
        ok, failed = collect(done)
        failed += [(ref, CallTimeout(f"no fragment within {self.limit_s:g} s")) for ref in waiting]
        failed_workers = [(calls[ref][0], e) for ref, e in failed]
        self.held.update(i for i, _ in failed_workers)
        return [(info, calls[ref][1]) for ref, info in ok], failed_workers, len(ok), 0


class AsyncGather:
    """Workers run freely; take what finished within `window_s`, leave the rest running.

    Each worker has `depth` sample calls queued, so it starts its next fragment the
    moment it returns one instead of idling until the driver's next gather.
    """

    waits_for_learner = False

    def __init__(self, workers, window_s: float, limit_s: float, depth: int = 2):
        self.workers = workers
        self.window_s, self.limit_s = window_s, limit_s
        self.depth = depth
        self.inflight: dict = {}  # info ref -> (worker index, data ref)
        self.free = [depth] * len(workers)  # call slots each worker has open
        self.held: set[int] = set()  # restarting workers get no calls until released
        self.busy_since = [time.time()] * len(workers)  # when its oldest call in flight started running

    def hold(self, i: int) -> None:
        self.held.add(i)

    def release(self, i: int) -> None:
        self.held.discard(i)
        self.free[i] = self.depth - sum(1 for j, _ in self.inflight.values() if j == i)

    def _start_calls(self) -> None:
        for i in range(len(self.workers)):
            if self.free[i] == self.depth and i not in self.held:
                self.busy_since[i] = time.time()  # idle until now
            while self.free[i] > 0 and i not in self.held:
                info_ref, data_ref = self.workers[i].sample.remote(False)
                self.inflight[info_ref] = (i, data_ref)
                self.free[i] -= 1

    def gather(self, allow_sampling: bool, between=lambda: None):
        """-> ([(info, data ref)], [(worker index, error)], ready, late)."""
        if allow_sampling:  # workers back off while the learner catches up (update-to-data ratio)
            self._start_calls()
        if not self.inflight:
            time.sleep(self.window_s)
            return [], [], 0, 0
        ready, _ = ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=self.window_s)
        ok, failed = collect(ready)
        out, now = [], time.time()
        for ref, info in ok:
            i, data_ref = self.inflight.pop(ref)
            self.free[i] += 1
            self.busy_since[i] = now  # its next call (if any) runs from now
            out.append((info, data_ref))
        failed_calls = [(self.inflight.pop(ref)[0], e) for ref, e in failed]
        busy = {i for i, _ in self.inflight.values()}
        for i in busy - {i for i, _ in failed_calls} - self.held:
            if now - self.busy_since[i] > self.limit_s:
                failed_calls.append((i, CallTimeout(f"no fragment within {self.limit_s:g} s")))
        self.held.update(i for i, _ in failed_calls)
        done = {info.worker for _, info in ok}
        return out, failed_calls, len(done), len(busy - done)
