"""Noticing that Ray replaced a role's process, without blocking the driver.

Ray restarts a dead actor with its constructor arguments; the new process has a
new pid, and that is how a restart shows (a death between two calls fails no
call). `RoleWatch` keeps one `pid()` call in flight per watched actor, reads the
answers when they are ready, and reports which roles came back as new processes.
A role is `RoleLost` once two calls in a row find it dead (a role being restarted
answers "unavailable", or late; a dead one whose restarts are used up, "died"), or
when its calls keep failing for longer than the timeout.
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayTaskError

from distrl.core import RoleLost
from distrl.runtime.ray_setup import ACTOR_GONE


class RoleWatch:
    def __init__(self, actors: dict, timeout_s: float, interval_s: float = 1.0):
        self.actors = actors  # name -> actor handle
        self.timeout_s = timeout_s
        self.failing_since: dict[str, float] = {}  # name -> when its pid calls started failing
        self.died: dict[str, int] = {}  # name -> pid calls in a row that found it dead
        self.pids: dict[str, int | None] = dict.fromkeys(actors)
        self.restarts: dict[str, int] = dict.fromkeys(actors, 0)
        self.pending: dict[str, ray.ObjectRef] = {}
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
        if time.time() - self.last_ask >= self.interval_s:
            self.last_ask = time.time()
            for name, actor in self.actors.items():
                if name not in self.pending:
                    self.pending[name] = actor.pid.remote()
        return replaced

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
                    raise RoleLost(f"the {name.replace('_', ' ')} did not come back within {timeout_s:.0f} s") from None
                time.sleep(0.5)

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
