"""Noticing that Ray replaced a role's process, without blocking the driver.

Ray restarts a dead actor with its constructor arguments; the new process has a
new pid, and that is how a restart shows (a death between two calls fails no
call). `RoleWatch` keeps one `pid()` call in flight per watched actor, reads the
answers when they are ready, and reports which roles came back as new processes.
"""
from __future__ import annotations

import time

import ray
from ray.exceptions import GetTimeoutError, RayTaskError

from distrl.core import RoleLost
from distrl.runtime.ray_setup import ACTOR_GONE


class RoleWatch:
    def __init__(self, actors: dict, interval_s: float = 1.0):
        self.actors = actors  # name -> actor handle
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
                    except (*ACTOR_GONE, RayTaskError):
                        continue  # down or restarting: asked again next time
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
            except (*ACTOR_GONE, RayTaskError, GetTimeoutError):
                if time.time() > deadline:
                    raise RoleLost(f"the {name.replace('_', ' ')} did not come back within {timeout_s:.0f} s") from None
                time.sleep(0.5)

    def _seen(self, name: str, pid: int) -> bool:
        known, self.pids[name] = self.pids[name], pid
        if known is not None and pid != known:
            self.restarts[name] += 1
            return True
        return False
