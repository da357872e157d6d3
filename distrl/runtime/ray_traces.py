"""What the actors of a Ray run recorded (`log.trace`), collected on the driver: pulled at every checkpoint,
so that an actor that dies takes with it only the events since, and once more at the run's end."""
from __future__ import annotations

import time

import ray
from ray.exceptions import GetTimeoutError, RayTaskError

from distrl.observe.trace import TraceStore, tracer
from distrl.runtime.ray_setup import ACTOR_GONE


class ActorTraces:
    def __init__(self):
        self.kept, self.pulls = TraceStore(), []  # rings pulled so far, and pulls in flight

    def pull(self, actors: list) -> None:
        """Move what `actors` recorded so far to the driver. Not waited for: an actor busy in a call answers
        after it, and its answer is kept at the next pull or at the end."""
        ready, self.pulls = ray.wait(self.pulls, num_returns=len(self.pulls), timeout=0) if self.pulls else ([], [])
        self._keep(ready, deadline=0.0)
        self.pulls += [a.drain_trace.remote() for a in actors]

    def _keep(self, refs: list, deadline: float) -> None:
        for ref in refs:
            try:
                self.kept.add(ray.get(ref, timeout=max(0.0, deadline - time.time())))
            except (*ACTOR_GONE, RayTaskError, GetTimeoutError):
                pass  # it died before it answered (its events since the last pull went with it), or hangs

    def drains(self, actors: list, deadline: float) -> list[dict]:
        """Every actor's recorded events (one that died keeps those pulled before its death; one that has
        not answered by `deadline` those pulled before) and the driver's own."""
        refs, self.pulls = self.pulls + [a.drain_trace.remote() for a in actors], []
        self._keep(refs, deadline)
        self.kept.add(tracer().drain())
        return self.kept.drains()
