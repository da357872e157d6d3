"""`single` mode: rollout, replay and learner in this process; the evaluator in its own.

No Ray here: starting Ray costs ~6 s on a laptop, more than half of what
solving CartPole should take, and one process needs no object store. The
evaluator runs in a spawned process fed through a queue, so scoring never
stalls learning.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import time


from distrl.algos import data_path
from distrl.config import Config, from_dict, to_dict
from distrl.core import FragmentInfo
from distrl.learning import TrainStats, learn_block, make_store, next_block, write_priorities
from distrl.rollout import Rollout
from distrl.threads import one_compute_thread


def build_algorithm(cfg: Config):
    from distrl.algos import get_algorithm_class
    from distrl.envs import env_spec

    return get_algorithm_class(cfg.algo)(cfg, env_spec(cfg.env.id, cfg.env.kwargs))


def acting_policy(cfg: Config, worker_index: int, num_workers: int):
    """The policy alone, without the learner's module: for most algorithms the process never loads torch."""
    from distrl.algos import make_policy
    from distrl.envs import env_spec

    policy = make_policy(cfg, env_spec(cfg.env.id, cfg.env.kwargs), worker_index, num_workers)
    one_compute_thread()  # and torch's, if the policy loaded it (A3C computes gradients with it)
    return policy


def evaluator_main(cfg_dict: dict, run_dir: str, start_time: float, inbox, outbox,
                   resume: dict | None = None) -> None:
    """Evaluator process: score each (weights, version, env_steps) it receives."""
    import os

    from distrl.evaluation import Evaluation

    parent = os.getppid()
    cfg = from_dict(cfg_dict)
    evaluation = Evaluation(acting_policy(cfg, -1, 1), cfg, run_dir, start_time, **(resume or {}))
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
        weights, version, env_steps = job
        outbox.put(evaluation.evaluate(weights, version, env_steps))


class LocalEvaluator:
    """Driver-side handle on the evaluator process: submit weights, poll results."""

    def __init__(self, cfg: Config, run_dir: str, start_time: float, resume: dict | None = None):
        ctx = mp.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=evaluator_main, name="Evaluator", daemon=True,
                                args=(to_dict(cfg), run_dir, start_time, self.inbox, self.outbox, resume))
        self.proc.start()
        self.ready = False
        self.busy = False

    def idle(self, wait: bool = False) -> bool:
        self.poll_ready(wait)
        return self.ready and not self.busy

    def poll_ready(self, wait: bool = False) -> None:
        if not self.ready and not self.busy:
            try:
                self.ready = self.outbox.get(timeout=120) == "ready" if wait else self.outbox.get_nowait() == "ready"
            except queue.Empty:
                pass

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

    def close(self) -> None:
        try:
            self.inbox.put(None)
            self.proc.join(timeout=5)
        finally:
            if self.proc.is_alive():
                self.proc.terminate()


class LocalRoles:
    """Every role in this process except the evaluator."""

    mode = "single"

    def __init__(self, cfg: Config, run_dir: str, start_time: float, eval_resume: dict | None = None):
        one_compute_thread(load_torch=True)
        self.cfg = cfg
        self.evaluator = LocalEvaluator(cfg, run_dir, start_time, eval_resume)  # first: overlaps its start-up
        algo = build_algorithm(cfg)
        self.learner = algo.make_learner(resolve_device(cfg.device))
        policy = algo.make_policy(0, 1)
        self.version = 0
        policy.set_weights(self.learner.get_weights(), self.version)
        self.policy = policy
        self.rollout = Rollout(policy, cfg.env.id, cfg.env.num_envs, cfg.rollout.fragment_length,
                               cfg.seed, 0, cfg.env.kwargs)
        self.store = make_store(cfg)
        self.on_policy = data_path(cfg.algo) != "replay"
        self.timings = {"env_s": 0.0, "inference_s": 0.0, "learner_s": 0.0}

    def get_state(self) -> dict:
        import torch

        return {"learner": {"state": self.learner.state_dict(), "torch_rng": torch.get_rng_state(),
                            "version": self.version},
                "store": self.store.state_dict(), "workers": [self.rollout.get_state()]}

    def store_digest(self) -> str:
        from distrl.runtime.persist import store_digest

        return store_digest(self.store.state_dict())

    def set_state(self, state: dict) -> None:
        import torch

        self.learner.load_state_dict(state["learner"]["state"])
        torch.set_rng_state(state["learner"]["torch_rng"])
        if state["store"] is not None:
            self.store.load_state_dict(state["store"])
        self.rollout.set_state(state["workers"][0])
        self.version = self.learner.updates
        self.policy.set_weights(self.learner.get_weights(), self.version)

    def gather(self, allow_sampling: bool) -> tuple[list[FragmentInfo], dict]:
        frag = self.rollout.sample()
        self.store.add(frag.data, frag.priorities)
        for k, v in frag.info.timings.items():
            self.timings[k] += v
        return [frag.info], {"ready": 1, "late": 0, "failed": 0}

    def train(self, budget: int, final: bool = False) -> list[TrainStats]:
        if budget <= 0:
            return []
        t0 = time.perf_counter()
        stats = TrainStats()
        while stats.consumed < budget:
            block = next_block(self.store, self.cfg, budget - stats.consumed)
            if block is None:
                stats.starved = True
                break
            write_priorities(self.store, block, learn_block(self.learner, block, stats))
        # On-policy data must come from the newest policy: publish after every update.
        interval = 1 if self.on_policy else self.cfg.learner.publish_interval
        if self.learner.updates - self.version >= interval:
            self.version = self.learner.updates
            self.policy.set_weights(self.learner.get_weights(), self.version)
        stats.version = self.version
        stats.learner_s = time.perf_counter() - t0
        self.timings["learner_s"] += stats.learner_s
        return [stats]

    def submit_eval(self, env_steps: int, wait: bool = False) -> bool:
        if not self.evaluator.idle(wait):
            return False
        self.evaluator.submit(self.learner.get_weights(), self.learner.updates, env_steps)
        return True


    def poll_eval(self, block: bool = False, timeout: float | None = None) -> list[dict]:
        return self.evaluator.poll(block, timeout)

    def eval_busy(self) -> bool:
        return self.evaluator.busy

    def time_breakdown(self) -> dict:
        return dict(self.timings)

    def close(self) -> None:
        self.evaluator.close()


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
