"""Watching the roles' processes without blocking the driver: who died, who hangs, who is back.

Deaths and restarts are Ray's to report (`ActorTable`, the GCS actor table): a death is counted there
the moment Ray sees it. What the table cannot tell is a hang: a stopped process (SIGSTOP), or a node Ray
has not yet declared lost, stays ALIVE there. So `RoleWatch` also keeps one `pid()` call in flight per
watched actor; roles answer it on a thread of their own, so a role busy in a long call still answers,
and one that leaves it unanswered for `fault.role_timeout_s` while ALIVE is hung. Ray restarts only
dead processes: a hung one is ended (`ActorTable.end`), and Ray restarts it like any other death.

A new pid answering is the moment a role is back as a new process: the driver then puts it back in the
run (`RayRoles._recover`). A role is `RoleLost` when Ray gives up on it (DEAD: its restarts are used
up) or it does not come back within the timeout.
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import GetTimeoutError, RayTaskError

from distrl.core import RoleLost
from distrl.runtime.deaths import COMING_BACK, ActorTable
from distrl.runtime.faultlog import start_budget
from distrl.runtime.ray_setup import ACTOR_GONE


class RoleWatch:
    def __init__(self, actors: dict, table: ActorTable, timeout_s: float, interval_s: float = 1.0):
        self.actors = actors  # name -> actor handle
        self.table, self.timeout_s = table, timeout_s
        self.start_s = start_budget(timeout_s)  # to start, or come back after a death
        self.pids: dict[str, int | None] = dict.fromkeys(actors)
        self.new_processes: dict[str, int] = dict.fromkeys(actors, 0)  # restarts seen as new pids answering
        self.failed: dict[str, float] = {}  # name -> when its pid calls started failing (dead or restarting)
        self.pending: dict[str, ray.ObjectRef] = {}
        self.asked: dict[str, float] = {}  # name -> when its pending pid call was sent
        self.interval_s, self.last_ask = interval_s, 0.0
        # Roles already reported lost: the run winds down without them (a last checkpoint, the summary),
        # and the health looks its waits take in between go on for the others without raising again.
        self.lost: set[str] = set()

    def poll(self) -> list[str]:
        """Roles whose process was replaced since the last look, now answering."""
        self.table.poll()
        replaced = []
        if self.pending:
            ready, _ = ray.wait(list(self.pending.values()), num_returns=len(self.pending), timeout=0)
            for name, ref in list(self.pending.items()):
                if ref in ready:
                    del self.pending[name]
                    if self._answered(name, ref):
                        replaced.append(name)
        for name in self.actors:
            self._judge(name)
        if time.time() - self.last_ask >= self.interval_s:
            self.last_ask = time.time()
            for name, actor in self.actors.items():
                if name not in self.pending:
                    self.pending[name] = actor.pid.remote()
                    self.asked[name] = self.last_ask
        return replaced

    def _answered(self, name: str, ref) -> bool:
        """Read a pid call that finished: True if it is a new process."""
        try:
            pid = ray.get(ref)
        except (*ACTOR_GONE, RayTaskError):
            self.failed.setdefault(name, time.time())  # down or restarting: asked again next time
            return False
        return self._seen(name, pid)

    def _judge(self, name: str) -> None:
        """RoleLost for a role Ray gave up on or that does not come back in time; a hung one is ended."""
        if name in self.lost:
            return
        self._check_dead(name)
        state, since = self.table.state(self.actors[name])
        role, now = name.replace("_", " "), time.time()
        if not self.table.readable:  # no states to go by: a role is down while its calls fail, hung while silent
            state, since = ("RESTARTING", self.failed[name]) if name in self.failed else ("ALIVE", 0.0)
        if state in COMING_BACK and self.pids[name] is not None and now - since > self.start_s:
            self.lost.add(name)
            raise RoleLost(f"the {role} died and did not come back within {self.start_s:g} s")
        asked = self.asked.get(name, now)
        if name in self.pending and state == "ALIVE" and now - max(asked, since) > self.timeout_s:
            self.end_hung(name)

    def end_hung(self, name: str) -> None:
        """End a role that answers nothing (Ray restarts it); its next answer is from a new process."""
        self.table.end(self.actors[name], f"hung (no answer within {self.timeout_s:g} s), ended")
        self.pending.pop(name, None)

    def wait_for(self, name: str) -> bool:
        """Block until `name` answers; True if it is a new process. One that hangs meanwhile is ended and
        waited for again; RoleLost when it has not answered within its start budget of starting or coming
        back, or Ray gave up on it."""
        actor, now, timeout_s = self.actors[name], time.time(), self.start_s
        deadline, ref = now + timeout_s, self.pending.pop(name, None)
        asked = self.asked.get(name, now) if ref is not None else now
        ref = ref or actor.pid.remote()
        while True:
            try:
                return self._seen(name, ray.get(ref, timeout=max(0.05, min(1.0, deadline - time.time()))))
            except GetTimeoutError:
                self.table.poll()
                self._check_dead(name)
                state, since = self.table.state(actor)
                if state == "ALIVE" and time.time() - max(asked, since) > self.timeout_s:
                    self.end_hung(name)
                    deadline = time.time() + timeout_s  # its restart gets the time a start gets
                    ref, asked = actor.pid.remote(), time.time()
            except (*ACTOR_GONE, RayTaskError):
                self.failed.setdefault(name, time.time())
                self.table.poll(force=True)
                self._check_dead(name)
                time.sleep(0.2)
                ref, asked = actor.pid.remote(), time.time()
            if time.time() > deadline:
                self.lost.add(name)
                raise self._gave_up(name, timeout_s) from None

    def _check_dead(self, name: str) -> None:
        """RoleLost if Ray gave up on it (a wait on that role itself raises it each time)."""
        if self.table.state(self.actors[name])[0] == "DEAD":
            self.lost.add(name)
            raise RoleLost(f"the {name.replace('_', ' ')} died and its restarts are used up (fault.max_role_restarts)")

    def _gave_up(self, name: str, timeout_s: float) -> RoleLost:
        role = name.replace("_", " ")
        if self.pids[name] is None:
            return RoleLost(f"the {role} did not start within {timeout_s:g} s")
        return RoleLost(f"the {role} died and did not come back within {timeout_s:g} s")

    def _seen(self, name: str, pid: int) -> bool:
        self.failed.pop(name, None)
        known, self.pids[name] = self.pids[name], pid
        if known is not None and pid != known:
            self.new_processes[name] += 1
            return True
        return False
