"""`single` mode: rollout, replay and learner in this process; the evaluator in its own.

No Ray here: starting Ray and its actor processes costs seconds, more than half
of what solving CartPole should take, and one process needs no object store.
The evaluator runs in a spawned process fed through a queue, so scoring never
stalls learning.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue

from distrl.config import Config, from_dict, to_dict
from distrl.core import Gathered, Roles, RunState, TrainStats
from distrl.observe.trace import configure, tracer
from distrl.roles.evaluation import make_evaluation
from distrl.roles.factory import make_algorithm, make_rollout, policy_seed, resolve_device, trace_settings
from distrl.roles.learning import LocalIO
from distrl.runtime.pacing import learner_loop, make_experience
from distrl.threads import one_compute_thread


def evaluator_main(cfg_dict: dict, start_time: float, inbox, outbox, resume: dict | None = None) -> None:
    """Evaluator process: score each (weights, version, env_steps) it receives."""
    parent = os.getppid()
    cfg = from_dict(cfg_dict)
    configure("evaluator", None, *trace_settings(cfg))
    evaluation = make_evaluation(cfg, start_time, resume)
    outbox.put("ready")
    while True:
        try:
            job = inbox.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the driver died (e.g. SIGKILL): don't linger as an orphan
                return
            continue
        if job is None:
            return
        if job == "trace":
            outbox.put(tracer().drain())
            continue
        weights, version, env_steps = job
        outbox.put(evaluation.evaluate(weights, version, env_steps))


class LocalEvaluator:
    """Driver-side handle on the evaluator process: submit weights, poll results."""

    def __init__(self, cfg: Config, start_time: float, resume: dict | None = None):
        ctx = mp.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=evaluator_main, name="Evaluator", daemon=True,
                                args=(to_dict(cfg), start_time, self.inbox, self.outbox, resume))
        self.proc.start()
        self.ready = False
        self.busy = False

    def idle(self, wait: bool = False) -> bool:
        if not self.ready and not self.busy:
            try:
                self.ready = self.outbox.get(timeout=120 if wait else None, block=wait) == "ready"
            except queue.Empty:
                pass
        return self.ready and not self.busy

    def submit(self, weights, version: int, env_steps: int) -> None:
        self.inbox.put((weights, version, env_steps))
        self.busy = True

    def poll(self, block: bool = False, timeout: float | None = None) -> list[dict]:
        out = []
        while self.busy:
            try:
                out.append(self.outbox.get(block=block, timeout=timeout))
                self.busy = False
            except queue.Empty:
                break
        return out

    def drain_trace(self) -> dict | None:
        """What the evaluator process recorded (after the evaluation in flight, if any)."""
        self.poll(block=True, timeout=60)
        if self.busy or not self.proc.is_alive():
            return None
        self.inbox.put("trace")
        try:
            return self.outbox.get(timeout=30)
        except queue.Empty:
            return None

    def close(self) -> None:
        try:
            self.inbox.put(None)
            self.proc.join(timeout=5)
        finally:
            if self.proc.is_alive():
                self.proc.terminate()


class LocalRoles(Roles):
    """Every role in this process except the evaluator."""

    def __init__(self, cfg: Config, start_time: float, eval_resume: dict | None = None):
        one_compute_thread(load_torch=True)
        configure("main", None, *trace_settings(cfg))
        self.cfg = cfg
        self.evaluator = LocalEvaluator(cfg, start_time, eval_resume)  # first: overlaps its start-up
        algo = make_algorithm(cfg)
        learner = algo.make_learner(resolve_device(cfg.device))
        self.policy = algo.make_policy(0, 1, policy_seed(cfg, 0))
        self.experience = make_experience(cfg)
        self.loop = learner_loop(learner, cfg, LocalIO(self.experience, self.policy))
        self.loop.publish()
        self.rollout = make_rollout(cfg, self.policy, cfg.seed, 0)
        self.timings = {"env_s": 0.0, "inference_s": 0.0, "learner_s": 0.0}

    def get_state(self) -> RunState:
        max_bytes = self.cfg.checkpoint.max_replay_bytes
        return {"learner": self.loop.get_state(), "workers": [self.rollout.get_state()],
                "store": lambda directory: self.experience.write(directory, max_bytes)}

    def set_state(self, state: RunState) -> None:
        if state["store"] is not None:
            self.experience.load(state["store"])
        if state["workers"] and state["workers"][0] is not None:
            self.rollout.set_state(state["workers"][0])
        self.loop.set_state(state["learner"])

    def store_digest(self) -> str | None:
        return self.experience.digest()

    def gather(self, allow_sampling: bool) -> Gathered:
        if not allow_sampling:  # the learner is behind: this pass only trains
            return Gathered()
        frag = self.rollout.sample()
        self.experience.add(frag.data, frag.priorities, frag.info.fragment_id)
        for k, v in frag.info.timings.items():
            self.timings[k] += v
        return Gathered([frag.info], ready=1)

    def train(self, budget: int, final: bool = False) -> list[TrainStats]:
        if budget <= 0:
            return []
        # Capped as a Ray learner call is, so the driver regains control often enough to log, evaluate and stop.
        stats = self.loop.train(min(budget, 4 * self.cfg.learner.batches_per_call))
        self.timings["learner_s"] += stats.learner_s + stats.wait_s
        return [stats]

    def submit_eval(self, env_steps: int, wait: bool = False) -> bool:
        if not self.evaluator.idle(wait):
            return False
        weights, version = self.loop.io.published  # as a worker acts with them: never non-finite
        self.evaluator.submit(weights, version, env_steps)
        return True

    def poll_eval(self, block: bool = False, timeout: float | None = None) -> list[dict]:
        return self.evaluator.poll(block, timeout)

    def eval_busy(self) -> bool:
        return self.evaluator.busy

    def time_breakdown(self) -> dict[str, float]:
        return dict(self.timings)

    def traces(self) -> list[dict]:
        if not self.cfg.log.trace:
            return []
        evaluator = self.evaluator.drain_trace()
        return [tracer().drain(), *([evaluator] if evaluator else [])]

    def close(self) -> None:
        self.evaluator.close()
