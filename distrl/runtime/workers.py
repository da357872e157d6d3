"""The rollout-worker actors as one pool: sampling through a gather strategy, and their restarts.

A worker's restart is counted when it answers from a new process (a fragment or a health check
with a new pid), so a worker killed between two calls is counted too, and the count needs no
other role to stay alive. A worker that stays unreachable for `fault.worker_timeout_s` is lost:
it gets no more calls, and is taken back if it ever answers again.
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import RayTaskError

from distrl.runtime.gather import AsyncGather, SyncGather
from distrl.runtime.ray_setup import ACTOR_GONE


class WorkerPool:
    def __init__(self, workers: list, cfg):
        self.workers = workers
        self.timeout_s = cfg.fault.worker_timeout_s
        self.gatherer = (SyncGather(workers, self.timeout_s) if cfg.mode == "sync"
                         else AsyncGather(workers, cfg.async_.window_s))
        self.pids: dict[int, int] = {}
        self.restarts = 0
        self.restarting: dict[int, tuple[ray.ObjectRef, float]] = {}  # index -> (health check, down since)
        self.lost: set[int] = set()

    def gather(self, allow_sampling: bool) -> tuple[list, int, int, int]:
        """([(FragmentInfo, data ref)], calls that failed, workers ready, workers late)."""
        self._check_restarting()
        pairs, failed, ready, late = self.gatherer.gather(allow_sampling)
        for i, err in dict(failed).items():  # one restart per worker, however many calls failed
            if i in self.restarting:
                continue
            if not isinstance(err, ACTOR_GONE):
                # An exception in the worker (or a call past its timeout) leaves the process alive but
                # suspect: restart it fresh.
                ray.kill(self.workers[i], no_restart=False)
            self.restarting[i] = (self.workers[i].pid.remote(), time.time())
        for info, _ in pairs:
            self._seen(info.worker, info.pid)
        return pairs, len(failed), ready, late

    def _seen(self, i: int, pid: int) -> None:
        if self.pids.get(i, pid) != pid:
            self.restarts += 1
        self.pids[i] = pid

    def _check_restarting(self) -> None:
        """Hand workers back to the gatherer once their restarted process answers; give up on the silent."""
        if not self.restarting:
            return
        refs = [ref for ref, _ in self.restarting.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for i, (ref, since) in list(self.restarting.items()):
            if ref not in ready:
                continue
            try:
                self._seen(i, ray.get(ref))
            except (*ACTOR_GONE, RayTaskError):
                if time.time() - since > self.timeout_s:
                    self.lost.add(i)
                self.restarting[i] = (self.workers[i].pid.remote(), since)  # still coming back: ask again
                continue
            del self.restarting[i]
            self.lost.discard(i)
            self.gatherer.release(i)

    def settle(self, timeout_s: float) -> None:
        """Ask every worker its pid: one restarted since its last answer is counted now (a run's end)."""
        refs = {i: w.pid.remote() for i, w in enumerate(self.workers) if i not in self.lost}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        for i, ref in refs.items():
            if ref in ready:
                try:
                    self._seen(i, ray.get(ref))
                except (*ACTOR_GONE, RayTaskError):
                    pass  # still down: not counted

    def all_lost(self) -> bool:
        return len(self.lost) == len(self.workers)
