"""Watching the roles' processes without blocking the driver: who died, who hangs, who is back.

Deaths and restarts are Ray's to report (`ActorTable`, the GCS actor table): a death is counted there
the moment Ray sees it. What the table cannot tell is a hang: a stopped process (SIGSTOP), or a node Ray
has not yet declared lost, stays ALIVE there. The roles' heartbeats tell it (`Heartbeats`, on a thread of
the driver's own): one silent for `fault.role_timeout_s` is ended, and Ray restarts it like any other death.

`RoleWatch` reads those heartbeats on the driver's thread: a new pid answering is the moment a role is back
as a new process, and the driver then puts it back in the run (`RayRoles._recover`). A role is `RoleLost`
when Ray gives up on it (DEAD: its restarts are used up) or it does not come back within
`fault.start_timeout_s`. At a run's stop, the roles silent then are ended for good (`end_silent`).
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import GetTimeoutError, RayTaskError

from distrl.core import RoleLost
from distrl.runtime.deaths import COMING_BACK
from distrl.runtime.heartbeat import Heartbeats, silent
from distrl.runtime.ray_setup import ACTOR_GONE


def end_silent(watch: "RoleWatch", pool, unrecovered: set[str]) -> list[str]:
    """At a run's stop: end, with no restart, the roles of `watch` and the workers of `pool` (a WorkerPool)
    that are `silent` (`unrecovered`: roles back but not yet put back in the run, silent too); their labels."""
    roles = {n: a for n, a in watch.actors.items() if n not in watch.lost}
    workers = {f"worker {i}": w for i, w in enumerate(pool.workers) if i not in pool.lost}
    known = {**watch.pids, **{f"worker {i}": pid for i, pid in pool.pids.items()}}
    quiet = set(silent({**roles, **workers}, known)) | (unrecovered & set(roles))
    quiet |= {f"worker {i}" for i in pool.restarting}
    watch.table.poll(force=True)  # their processes as they are now
    for name in sorted(quiet & set(roles)):
        watch.lost.add(name)
        watch.beats.stop_watching(name)
        watch.table.end_for_good(roles[name])
    pool.end_for_good([i for i in range(len(pool.workers)) if f"worker {i}" in quiet])
    return sorted(watch.table.of(roles[n]).label if n in roles else n for n in quiet)


class RoleWatch:
    def __init__(self, actors: dict, beats: Heartbeats, start_s: float):
        self.actors, self.beats, self.table = actors, beats, beats.table  # name -> actor handle
        for name, actor in actors.items():
            beats.watch(name, actor)
        self.start_s = start_s  # to start, or come back after a death
        self.interrupt = lambda: None  # called every second of a wait: raises to cut it short (the run's stop)
        self.pids: dict[str, int | None] = dict.fromkeys(actors)
        self.heard: dict[str, float] = dict.fromkeys(actors, 0.0)  # when the newest heartbeat taken in was sent
        self.new_processes: dict[str, int] = dict.fromkeys(actors, 0)  # restarts seen as new pids answering
        # Roles already reported lost: the run winds down without them (a last checkpoint, the summary),
        # and the looks its waits take in between go on for the others without raising again.
        self.lost: set[str] = set()

    def poll(self) -> list[str]:
        """Roles whose process was replaced since the last look, now answering."""
        self.beats.look()
        replaced = []
        for name in self.actors:
            if name in self.lost:
                continue
            sent, pid = self.beats.answer.get(name, (0.0, None))
            if pid is not None and sent > self.heard[name]:
                self.heard[name] = sent
                if self._seen(name, pid):
                    replaced.append(name)
            self._judge(name)
        return replaced

    def _judge(self, name: str) -> None:
        """RoleLost for a role Ray gave up on, or that does not come back in time."""
        self._check_dead(name)
        state, since = self.beats.state(name)
        if state in COMING_BACK and self.pids[name] is not None and time.time() - since > self.start_s:
            self.lost.add(name)
            raise RoleLost(f"the {name.replace('_', ' ')} died and did not come back within {self.start_s:g} s")

    def wait_for(self, name: str) -> bool:
        """Block until `name` answers; True if it is a new process. One that hangs meanwhile is ended (by the
        heartbeats) and waited for again; RoleLost when it has not answered within its start budget of starting
        or coming back, or Ray gave up on it."""
        actor, sent = self.actors[name], time.time()
        deadline, ref = sent + self.start_s, actor.pid.remote()
        while True:
            try:
                pid = ray.get(ref, timeout=max(0.05, min(1.0, deadline - time.time())))
                self.heard[name] = max(self.heard[name], sent)
                return self._seen(name, pid)
            except GetTimeoutError:
                self.interrupt()
                self.beats.look()
                self._check_dead(name)
                state, since = self.beats.state(name)
                if state in COMING_BACK:  # a restart (a hung one was ended meanwhile) gets the time a start gets
                    deadline = max(deadline, since + self.start_s)
            except (*ACTOR_GONE, RayTaskError):
                self.interrupt()
                self.table.poll(force=True)
                self._check_dead(name)
                time.sleep(0.2)
                ref, sent = actor.pid.remote(), time.time()
            if time.time() > deadline:
                self.lost.add(name)
                raise self._gave_up(name) from None

    def _check_dead(self, name: str) -> None:
        """RoleLost if Ray gave up on it (a wait on that role itself raises it each time)."""
        if self.table.state(self.actors[name])[0] == "DEAD":
            self.lost.add(name)
            self.beats.stop_watching(name)
            raise RoleLost(f"the {name.replace('_', ' ')} died and its restarts are used up (fault.max_role_restarts)")

    def _gave_up(self, name: str) -> RoleLost:
        role = name.replace("_", " ")
        if self.pids[name] is None:
            return RoleLost(f"the {role} did not start within {self.start_s:g} s")
        return RoleLost(f"the {role} died and did not come back within {self.start_s:g} s")

    def _seen(self, name: str, pid: int) -> bool:
        known, self.pids[name] = self.pids[name], pid
        if known is not None and pid != known:
            self.new_processes[name] += 1
            return True
        return False
