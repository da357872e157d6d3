"""The rollout-worker actors as one pool: sampling through a gather strategy, their health, their restarts.

A worker's restarts are Ray's count (`ActorTable`): a worker killed at any moment is counted once Ray
sees it die, even if the run ends before the worker answers again. Each worker also answers a health
check (`pid`, on a thread of its own): one that leaves it unanswered for `fault.role_timeout_s` while
ALIVE (stopped, or on a node not yet declared lost) is hung, and is ended so that Ray restarts it. A call
that fails, or outlives its time, restarts its worker too. A worker that stays unreachable for
`fault.worker_timeout_s` is lost: it gets no more calls, and is taken back if it ever answers again.
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import RayTaskError

from distrl.runtime.deaths import ActorTable
from distrl.runtime.gather import AsyncGather, SyncGather
from distrl.runtime.ray_setup import ACTOR_GONE


class WorkerPool:
    def __init__(self, workers: list, fault, window_s: float | None, table: ActorTable, external: int = 0):
        """`fault`: the config's section; `window_s`: async mode's gather window (None: sync mode); the last
        `external` of `workers` are simulator servers (their restarts count apart, as `external`)."""
        self.workers, self.table = workers, table
        for i, w in enumerate(workers):
            server = i >= len(workers) - external
            table.track(w, "external" if server else "workers", "simulator server" if server else f"worker {i}")
        self.timeout_s, self.role_timeout_s = fault.worker_timeout_s, fault.role_timeout_s
        limit_s = self.timeout_s + self.role_timeout_s  # a worker may wait a role's timeout on a hung role
        self.gatherer = (SyncGather(workers, limit_s) if window_s is None
                         else AsyncGather(workers, window_s, limit_s))
        self.pids: dict[int, int] = {}
        self.new_processes = 0  # restarts seen as new pids: the count where Ray's table cannot be read
        self.restarting: dict[int, tuple[ray.ObjectRef, float]] = {}  # index -> (health check, down since)
        self.lost: set[int] = set()
        self.health: dict[int, tuple[ray.ObjectRef, float]] = {}  # index -> (pid call in flight, sent)
        self.last_check = 0.0

    @property
    def restarts(self) -> int:
        return self.table.restarts("workers") if self.table.readable else self.new_processes

    def gather(self, allow_sampling: bool, between=None) -> tuple[list, int, int, int]:
        """([(FragmentInfo, data ref)], calls that failed, workers ready, workers late); `between()` runs every
        second of waiting (the driver's look at every role, this pool's `check` included)."""
        self.check()
        pairs, failed, ready, late = self.gatherer.gather(allow_sampling, between or self.check)
        for i, err in dict(failed).items():  # one restart per worker, however many calls failed
            if i in self.restarting:
                continue
            if not isinstance(err, ACTOR_GONE):
                # An exception in the worker, or a call past its time, leaves the process alive but
                # suspect: restart it fresh.
                self.table.end(self.workers[i], f"failed ({str(err).splitlines()[0][:80] or type(err).__name__}), ended")
            self._down(i)
        for info, _ in pairs:
            self._seen(info.worker, info.pid)
        return pairs, len(failed), ready, late

    def check(self) -> None:
        """At most every second: take back restarted workers, end hung ones."""
        if time.time() - self.last_check < 1.0:
            return
        self.last_check = time.time()
        self.table.poll()
        self._check_restarting()
        self._check_health()

    def _down(self, i: int) -> None:
        self.health.pop(i, None)
        self.gatherer.hold(i)
        self.restarting[i] = (self.workers[i].pid.remote(), time.time())

    def _check_health(self) -> None:
        now = time.time()
        refs = {i: ref for i, (ref, _) in self.health.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0) if refs else ([], [])
        for i, ref in refs.items():
            if ref in ready:
                del self.health[i]
                try:
                    self._seen(i, ray.get(ref))
                except (*ACTOR_GONE, RayTaskError):
                    pass  # dead: its calls fail, which restarts it
                continue
            state, since = self.table.state(self.workers[i]) if self.table.readable else ("ALIVE", 0.0)
            if state == "ALIVE" and now - max(self.health[i][1], since) > self.role_timeout_s:
                self.table.end(self.workers[i], f"hung (no answer within {self.role_timeout_s:g} s), ended")
                self._down(i)
        for i, w in enumerate(self.workers):
            if i not in self.health and i not in self.restarting and i not in self.lost:
                self.health[i] = (w.pid.remote(), now)

    def _seen(self, i: int, pid: int) -> None:
        if self.pids.get(i, pid) != pid:
            self.new_processes += 1
        self.pids[i] = pid

    def _check_restarting(self) -> None:
        """Hand workers back to the gatherer once their restarted process answers; give up on the silent."""
        if not self.restarting:
            return
        refs = [ref for ref, _ in self.restarting.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for i, (ref, since) in list(self.restarting.items()):
            if ref not in ready:
                if time.time() - since > self.timeout_s:
                    self.lost.add(i)
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
        """For an exact count at a run's end: a worker coming back (lost ones too) that answers within
        `timeout_s` is taken back, so `lost` holds only the workers still gone."""
        refs = [ref for ref, _ in self.restarting.values()]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        self.last_check = 0.0
        self.check()

    def all_lost(self) -> bool:
        return bool(self.workers) and len(self.lost) == len(self.workers)
