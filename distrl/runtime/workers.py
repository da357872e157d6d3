"""The rollout-worker actors as one pool: sampling through a gather strategy, their health, their restarts.

A worker's restarts are Ray's count (`ActorTable`): a worker killed at any moment is counted once Ray
sees it die, even if the run ends before the worker answers again. Each worker's heartbeat is taken with
every role's (`Heartbeats`): one silent for `fault.role_timeout_s` while ALIVE (stopped, or on a node not
yet declared lost) is hung, and is ended so that Ray restarts it; its calls then fail. A call that fails, or
that delivers nothing for `fault.worker_timeout_s` (plus the time a role it calls takes to be found hung and
restarted) though its worker beats, restarts its worker too. A
worker that stays unreachable for `fault.worker_timeout_s` is lost: it gets no more calls, and is taken
back if it ever answers again.
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import RayTaskError

from distrl.runtime.gather import AsyncGather, SyncGather
from distrl.runtime.heartbeat import Heartbeats
from distrl.runtime.ray_setup import ACTOR_GONE


class WorkerPool:
    def __init__(self, workers: list, fault, window_s: float | None, beats: Heartbeats, external: int = 0):
        """`fault`: the config's section; `window_s`: async mode's gather window (None: sync mode); the last
        `external` of `workers` are simulator servers (their restarts count apart, as `external`)."""
        self.workers, self.beats, self.table = workers, beats, beats.table
        for i, w in enumerate(workers):
            server = i >= len(workers) - external
            self.table.track(w, "external" if server else "workers", "simulator server" if server else f"worker {i}")
            beats.watch("simulator_server" if server else f"rollout_worker_{i}", w)
        self.timeout_s = fault.worker_timeout_s
        # A call may wait on a role it calls being found hung and restarted before its own fragment's time.
        limit_s = fault.worker_timeout_s + fault.role_timeout_s + fault.start_timeout_s
        self.gatherer = (SyncGather(workers, limit_s) if window_s is None else AsyncGather(workers, window_s, limit_s))
        self.pids: dict[int, int] = {}
        self.new_processes = 0  # restarts seen as new pids: the count where Ray's table cannot be read
        self.restarting: dict[int, tuple[ray.ObjectRef, float]] = {}  # index -> (health check, down since)
        self.lost: set[int] = set()
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
        """At most every second: take back restarted workers (hung ones are ended by the heartbeats' thread)."""
        if time.time() - self.last_check < 1.0:
            return
        self.last_check = time.time()
        self.table.poll()
        self._check_restarting()

    def _down(self, i: int) -> None:
        self.gatherer.hold(i)
        self.restarting[i] = (self.workers[i].pid.remote(), time.time())

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

    def end_for_good(self, indices: list[int]) -> None:
        """End these workers' processes with no restart (the run's stop); a lost one stays counted lost."""
        for i in indices:
            self.beats.stop_watching(f"rollout_worker_{i}")
            self.table.end_for_good(self.workers[i])
            self.restarting.pop(i, None)

    def all_lost(self) -> bool:
        return bool(self.workers) and len(self.lost) == len(self.workers)
