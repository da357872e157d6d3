"""Noticing that Ray replaced a role's process, without blocking the driver.

Ray restarts a dead actor with its constructor arguments; the new process has a
new pid, and that is how a restart shows (a death between two calls fails no
call). `RoleWatch` keeps one `pid()` call in flight per watched actor, reads the
answers when they are ready, and reports which roles came back as new processes.
A role is `RoleLost` once two calls in a row find it dead (a role being restarted
answers "unavailable", or late; a dead one whose restarts are used up, "died"), or
when its calls keep failing for longer than the timeout.

Roles answer `pid()` on a thread of their own, so a role busy in a long call still answers it. One
whose `pid()` goes unanswered for longer than the timeout without failing is alive but hung (a
SIGSTOPped process, a lost node that Ray has not declared dead). Ray restarts only dead processes, so it
is `RoleLost` too, as is a role whose work call outlasts the timeout (stuck, or waiting on a hung role):
the run ends naming the role, whose process is ended so that winding down fails fast on it instead of
waiting on it again.
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayTaskError

from distrl.core import RoleLost
from distrl.runtime.ray_setup import ACTOR_GONE


class RoleWatch:
    def __init__(self, actors: dict, timeout_s: float, interval_s: float = 1.0, waits_on: dict | None = None):
        self.actors = actors  # name -> actor handle
        self.waits_on = waits_on or {}  # name -> roles its calls wait on (a learner on the replay server)
        self.timeout_s = timeout_s
        self.failing_since: dict[str, float] = {}  # name -> when its pid calls started failing
        self.died: dict[str, int] = {}  # name -> pid calls in a row that found it dead
        self.pids: dict[str, int | None] = dict.fromkeys(actors)
        self.restarts: dict[str, int] = dict.fromkeys(actors, 0)
        self.pending: dict[str, ray.ObjectRef] = {}
        self.asked: dict[str, float] = {}  # name -> when its pending pid call was sent
        self.interval_s, self.last_ask = interval_s, 0.0

    def poll(self) -> list[str]:
        """Roles whose process was replaced since the last look (their restart already counted)."""
        replaced = []
        if self.pending:
            ready, _ = ray.wait(list(self.pending.values()), num_returns=len(self.pending), timeout=0)
            for name, ref in list(self.pending.items()):
                if ref in ready:
                    del self.pending[name]
                    try:
                        pid = ray.get(ref)
                    except (*ACTOR_GONE, RayTaskError) as e:
                        self._failing(name, e)  # down or restarting: asked again next time
                        continue
                    if self._seen(name, pid):
                        replaced.append(name)
            self._check_overdue()
        if time.time() - self.last_ask >= self.interval_s:
            self.last_ask = time.time()
            for name, actor in self.actors.items():
                if name not in self.pending:
                    self.pending[name] = actor.pid.remote()
                    self.asked[name] = self.last_ask
        return replaced

    def _check_overdue(self) -> None:
        """RoleLost for roles whose pid call has waited longer than the timeout: a busy role answers it
        between two of its calls, a dead one fails it."""
        now = time.time()
        late = [name for name in self.pending if now - self.asked[name] > self.timeout_s]
        for name in late:
            if name in self.failing_since:  # died, and its new process has not answered since
                raise RoleLost(f"the {name.replace('_', ' ')} died and did not come back within {self.timeout_s:.0f} s")
        if late:
            raise self.hung(late, self.timeout_s)

    def wait_for(self, name: str, timeout_s: float) -> bool:
        """Block until `name` answers; True if it is a new process (counted). RoleLost after `timeout_s`."""
        deadline = time.time() + timeout_s
        self.pending.pop(name, None)
        while True:
            try:
                pid = ray.get(self.actors[name].pid.remote(), timeout=max(0.1, deadline - time.time()))
                return self._seen(name, pid)
            except (*ACTOR_GONE, RayTaskError, GetTimeoutError) as e:
                if not isinstance(e, GetTimeoutError):
                    self._failing(name, e)
                if time.time() > deadline:
                    raise self._gave_up(name, timeout_s) from None
                time.sleep(0.5)

    def _gave_up(self, name: str, timeout_s: float) -> RoleLost:
        role = name.replace("_", " ")
        if self.pids[name] is None:
            return RoleLost(f"the {role} did not start within {timeout_s:.0f} s (fault.role_timeout_s)")
        if name in self.failing_since:
            return RoleLost(f"the {role} died and did not come back within {timeout_s:.0f} s")
        return self.hung([name], timeout_s)

    def hung(self, names: list[str], timeout_s: float) -> RoleLost:
        """Why the run cannot go on with calls to `names` unanswered: the roles they wait on that are silent
        (a learner's call blocks on a stopped replay server), else they themselves. Those are ended, with
        no restart. A role that still answers its health check was only slow: the error says so."""
        causes = []
        for name in names:
            causes += [r for r in self.waits_on.get(name, ()) if r in self.actors and self._silent(r)] or [name]
        causes = list(dict.fromkeys(causes))
        slow = not any(self._silent(name) for name in causes)
        for name in causes:
            ray.kill(self.actors[name], no_restart=True)
        roles = " and the ".join(name.replace("_", " ") for name in causes)
        if slow:
            return RoleLost(f"a call to the {roles} took longer than {timeout_s:.0f} s (fault.role_timeout_s)")
        return RoleLost(f"the {roles} stopped answering: no reply within {timeout_s:.0f} s (fault.role_timeout_s)")

    def _silent(self, name: str, within_s: float = 2.0) -> bool:
        """No answer within `within_s` (a dead or restarting role fails its call: it is not hung)."""
        try:
            ray.get(self.actors[name].pid.remote(), timeout=within_s)
        except GetTimeoutError:
            return True
        except (*ACTOR_GONE, RayTaskError):
            pass
        return False

    def _failing(self, name: str, err: Exception) -> None:
        """The call in flight when a role dies fails too: only a second one in a row that finds it dead
        means Ray will not restart it."""
        role = name.replace("_", " ")
        self.died[name] = self.died.get(name, 0) + 1 if isinstance(err, ActorDiedError) else 0
        if self.died[name] >= 2:
            raise RoleLost(f"the {role} died and its restarts are used up (fault.max_role_restarts)")
        since = self.failing_since.setdefault(name, time.time())
        if time.time() - since > self.timeout_s:
            raise RoleLost(f"the {role} died and did not come back within {self.timeout_s:.0f} s")

    def _seen(self, name: str, pid: int) -> bool:
        self.failing_since.pop(name, None)
        self.died.pop(name, None)
        known, self.pids[name] = self.pids[name], pid
        if known is not None and pid != known:
            self.restarts[name] += 1
            return True
        return False
