"""The driver's side of a Ray run's Evaluator: the evaluation in flight, the results that arrived, and the
run's evaluations and best so far (what a restarted evaluator resumes with)."""
from __future__ import annotations

import ray
from ray.exceptions import RayTaskError

from distrl.roles.evaluation import LOWEST, rank
from distrl.runtime.ray_setup import ACTOR_GONE


class EvalCalls:
    def __init__(self, resume: dict | None):
        self.progress = {"evaluations": 0, "best": LOWEST, **(resume or {})}
        self.ref = None  # the evaluation in flight
        self.results: list[dict] = []  # arrived, not yet taken by the driver

    def submit(self, evaluator, env_steps: int) -> bool:
        if self.ref is not None:
            return False
        self.ref = evaluator.evaluate.remote(env_steps)
        return True

    def take(self) -> None:
        """Keep the evaluation in flight's result once it has arrived."""
        if self.ref is None or not ray.wait([self.ref], timeout=0)[0]:
            return
        ref, self.ref = self.ref, None
        try:
            _, result = ray.get(ref)
        except (*ACTOR_GONE, RayTaskError):
            return  # it died in the call: the watch puts it back
        if result is not None:
            self.progress["evaluations"] += 1
            self.progress["best"] = max(tuple(self.progress["best"]), rank(result))
            self.results.append(result)

    def solved(self) -> bool:
        return any(r.get("solved") for r in self.results)

    def drain(self) -> list[dict]:
        out, self.results = self.results, []
        return out
