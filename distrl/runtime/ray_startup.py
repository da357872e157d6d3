"""The Ray processes' first answers, said on the console (`StartupLine`) as each arrives.

Only says: whether a role started in time, died or hangs is `RoleWatch.wait_for`'s to judge (a worker's,
the pool's), on the driver's thread meanwhile. This thread asks each process for its pid once and
waits on all the answers together, so each is reported the moment it comes, whatever the driver waits on.
"""
from __future__ import annotations

import threading
import time

import ray
from ray.exceptions import RayTaskError

from distrl.observe.startup import StartupLine
from distrl.runtime.ray_setup import ACTOR_GONE

RETRY_S = 0.2  # a process that died starting is asked again this soon: Ray may be restarting it
SLICE_S = 0.25  # longest wait before the thread looks whether it was closed


class FirstAnswers:
    def __init__(self, processes: dict[str, object], line: StartupLine):
        """`processes`: console label -> actor handle, all started just now."""
        self.processes, self.line = processes, line
        self.asked = {actor.pid.remote(): label for label, actor in processes.items()}
        self.all_in, self.closed = threading.Event(), threading.Event()
        line.starting(list(processes))
        self.thread = threading.Thread(target=self._run, name="distrl-startup", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        heard: set[str] = set()  # answered, or failed to (died starting)
        while self.asked and not self.closed.is_set():
            ready, _ = ray.wait(list(self.asked), num_returns=1, timeout=SLICE_S)
            for ref in ready:
                label = self.asked.pop(ref)
                heard.add(label)
                try:
                    ray.get(ref)
                    self.line.ready(label)
                except (*ACTOR_GONE, RayTaskError):
                    time.sleep(RETRY_S)
                    self.asked[self.processes[label].pid.remote()] = label
            if len(heard) == len(self.processes):
                self.all_in.set()
        self.all_in.set()

    def wait(self, timeout_s: float) -> None:
        """Until every process has answered or failed to (a death is for its watcher to handle, not to wait
        on here), or `timeout_s` has passed. One that died is still said ready if it comes back before `close`."""
        self.all_in.wait(timeout_s)

    def close(self) -> None:
        self.closed.set()
        self.thread.join(timeout=2 * SLICE_S + RETRY_S)


def wait_for_started(roles) -> None:
    """Every role of `roles` (a RayRoles) answering, and the rollout workers started by then, each said on the
    console as it first answers (a second call says only the processes started since). Workers are given
    `fault.role_timeout_s` more after the roles: one later than that is the pool's to wait for (or give up on)
    as the run drives it."""
    started = {roles.table.of(a).label: a for a in [*roles.watch.actors.values(), *roles.workers]}
    answers = FirstAnswers({k: a for k, a in started.items() if k not in roles.startup.labels}, roles.startup)
    try:
        for name in roles.watch.actors:  # their processes start in parallel; wait once for all
            roles.watch.wait_for(name)
        answers.wait(roles.cfg.fault.role_timeout_s)
    finally:
        answers.close()
