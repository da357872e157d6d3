"""The one driver loop. Modes differ only in the roles object and its gather strategy."""
from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import dataclass, field

import numpy as np

from distrl.algos import data_path
from distrl.checkpoint import save_json
from distrl.config import Config, dump_yaml
from distrl.learning import add_to_sums, fragments_per_update
from distrl.observe import MetricsLogger
from distrl.runtime import persist


class Reservoir:
    """A uniform sample of at most `size` values from a stream (Vitter's algorithm R).

    Run-long lag percentiles from bounded memory: a plain list grew by every update.
    """

    def __init__(self, size: int = 20_000, seed: int = 0):
        self.buf = np.empty(size)
        self.seen = 0
        self.rng = np.random.default_rng(seed)

    def extend(self, xs) -> None:
        for x in xs:
            slot = self.seen if self.seen < len(self.buf) else int(self.rng.integers(0, self.seen + 1))
            if slot < len(self.buf):
                self.buf[slot] = x
            self.seen += 1

    def values(self) -> np.ndarray:
        return self.buf[:min(self.seen, len(self.buf))]


@dataclass
class Counters:
    """Everything the driver counts; one metrics.csv row is a snapshot of this."""

    env_steps: int = 0
    updates: int = 0
    consumed: int = 0  # batches the learner took (updates + dropped stale gradients)
    dropped: int = 0
    worker_restarts: int = 0
    fragments_dropped: int = 0
    env_errors: int = 0
    episodes: int = 0
    fragments: int = 0
    version: int = 0
    recent_returns: list = field(default_factory=list)
    lags: list = field(default_factory=list)
    all_lags: Reservoir = field(default_factory=Reservoir)
    loss_sum: float = 0.0
    loss_n: int = 0
    learner_scalars: dict = field(default_factory=dict)  # name -> [sum, count] since the last log row
    ready: list = field(default_factory=list)
    late: list = field(default_factory=list)
    eval_last: dict | None = None
    best_eval: float = -math.inf
    solved_at: float | None = None
    evaluations: list = field(default_factory=list)


def _mean(xs) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


class Driver:
    def __init__(self, cfg: Config, roles, run_dir: str, start_time: float, counters: Counters | None = None):
        self.cfg, self.roles, self.run_dir, self.start = cfg, roles, run_dir, start_time
        self.c = counters or Counters()
        self.logger = MetricsLogger(run_dir, cfg.log.tensorboard, cfg.log.progress, append=counters is not None,
                                    total_steps=cfg.stop.max_env_steps, initial_steps=self.c.env_steps)
        self.checkpoint_s: list[float] = []
        self.last_checkpoint = time.time()
        self.stop_requested: str | None = None
        self.failure: str | None = None
        self.on_policy = data_path(cfg.algo) != "replay"
        self.fpu = fragments_per_update(cfg)
        self.last_eval_submit = 0.0
        self.learner_starved = False
        self.last_eval_steps = self.c.env_steps
        self.last_log = self.last_log_steps = self.last_log_updates = None

    # --- budget: the update-to-data ratio holds in every mode -------------------
    def update_target(self) -> int:
        """Batches the learner should have consumed by now, given the data gathered."""
        if self.on_policy:
            return self.c.fragments // self.fpu  # each fragment is used exactly once
        started = self.c.env_steps - self.cfg.replay.learning_starts
        return int(self.cfg.learner.updates_per_step * started) if started >= 0 else 0

    def update_budget(self) -> int:
        inflight = getattr(self.roles, "updates_in_flight", lambda: 0)()
        return self.update_target() - self.c.consumed - inflight

    def sampling_allowed(self) -> bool:
        """Workers back off when the learner is behind (backpressure)."""
        if self.on_policy:
            return self.c.fragments - self.c.consumed * self.fpu < self.cfg.queue.capacity
        return self.learner_starved or self.update_budget() <= 8 * self.cfg.learner.batches_per_call

    # --- the loop ---------------------------------------------------------------
    def run(self) -> dict:
        self.last_log = time.time()
        self.last_log_steps, self.last_log_updates = self.c.env_steps, self.c.updates
        reason = None
        while reason is None:
            infos, counts = self.roles.gather(self.sampling_allowed())
            self._count_fragments(infos, counts)
            for stats in self.roles.train(self.update_budget()):
                self._count_training(stats)
            self._evaluate()
            reason = self._stop_reason()
            if self._log_due() or reason:
                self._log_row()
            if not reason and time.time() - self.last_checkpoint >= self.cfg.checkpoint.interval_s:
                persist.save(self)
                self.last_checkpoint = time.time()
        return self._finish(reason)

    def _count_fragments(self, infos, counts) -> None:
        self.c.fragments_dropped += counts["failed"]
        self.c.worker_restarts = getattr(self.roles, "restarts", 0)
        for info in infos:
            self.c.env_errors += info.env_errors
            self.c.env_steps += info.env_steps
            self.c.fragments += 1
            self.c.episodes += len(info.episode_returns)
            self.c.recent_returns = (self.c.recent_returns + list(info.episode_returns))[-100:]
        if counts["ready"] or counts["late"]:
            self.c.ready.append(counts["ready"])
            self.c.late.append(counts["late"])

    def _count_training(self, stats) -> None:
        self.learner_starved = stats.starved
        self.c.updates += stats.updates
        self.c.consumed += stats.consumed
        self.c.dropped += stats.dropped
        self.c.version = max(self.c.version, stats.version)
        self.c.lags.extend(stats.lags)
        self.c.all_lags.extend(stats.lags)
        self.c.loss_sum += stats.loss_sum
        for k, (total, n) in stats.scalars.items():
            add_to_sums(self.c.learner_scalars, k, total, n)
        self.c.loss_n += stats.updates

    def _log_due(self) -> bool:
        every = self.cfg.log.interval_steps
        if every:  # step-based rows land on the same env_steps in every deterministic run
            return self.c.env_steps // every > self.last_log_steps // every
        return time.time() - self.last_log >= self.cfg.log.interval_s

    def _evaluate(self, block: bool = False) -> None:
        for result in self.roles.poll_eval(block=block, timeout=60.0):
            self.c.eval_last = result
            self.c.evaluations.append(result)
            self.c.best_eval = max(self.c.best_eval, result["return_mean"])
            if result["solved"] and self.c.solved_at is None:
                self.c.solved_at = result["time_s"]
        every = self.cfg.eval.interval_steps
        if every:
            # Deterministic: score the weights at fixed env-step marks and wait for the result.
            if self.c.updates > 0 and self.c.env_steps // every > self.last_eval_steps // every:
                self.last_eval_steps = self.c.env_steps
                if self.roles.submit_eval(self.c.env_steps, wait=True) and not block:
                    self._evaluate(block=True)
            return
        now = time.time()
        if self.c.updates > 0 and now - self.last_eval_submit >= self.cfg.eval.interval_s:
            if self.roles.submit_eval(self.c.env_steps):
                self.last_eval_submit = now

    def _stop_reason(self) -> str | None:
        if self.c.solved_at is not None:
            return "solved"
        if self.stop_requested:
            return self.stop_requested
        if self.c.worker_restarts > self.cfg.fault.max_worker_restarts:
            self.failure = (f"stopped: {self.c.worker_restarts} rollout-worker restarts exceed "
                            f"fault.max_worker_restarts={self.cfg.fault.max_worker_restarts}")
            return "worker_failures"
        if self.c.env_errors > self.cfg.fault.max_env_errors:
            self.failure = (f"stopped: {self.c.env_errors} env exceptions exceed "
                            f"fault.max_env_errors={self.cfg.fault.max_env_errors}")
            return "env_errors"
        if time.time() - self.start >= self.cfg.stop.max_seconds:
            return "max_seconds"
        if self.cfg.stop.max_env_steps and self.c.env_steps >= self.cfg.stop.max_env_steps:
            return "max_env_steps"
        return None

    def _log_row(self) -> None:
        now = time.time()
        dt = max(now - self.last_log, 1e-9)
        ev = self.c.eval_last or {}
        lags = self.c.lags
        row = {
            "wall_s": round(now - self.start, 3), "env_steps": self.c.env_steps, "updates": self.c.updates,
            "episodes": self.c.episodes,
            "env_steps_per_s": round((self.c.env_steps - self.last_log_steps) / dt, 1),
            "updates_per_s": round((self.c.updates - self.last_log_updates) / dt, 2),
            "train_return_mean": _mean(self.c.recent_returns),
            "eval_return_mean": ev.get("return_mean"), "eval_return_std": ev.get("return_std"),
            "best_eval_return": self.c.best_eval if self.c.evaluations else None,
            "policy_lag_mean": _mean(lags), "policy_lag_max": max(lags) if lags else None,
            "loss": self.c.loss_sum / self.c.loss_n if self.c.loss_n else None,
            "workers_ready_mean": _mean(self.c.ready), "workers_late_mean": _mean(self.c.late),
            "fragments_dropped": self.c.fragments_dropped, "worker_restarts": self.c.worker_restarts,
            "env_errors": self.c.env_errors, "gradients_dropped": self.c.dropped, "weight_version": self.c.version,
        }
        learner = {k: total / n for k, (total, n) in sorted(self.c.learner_scalars.items()) if n}
        self.logger.row(row, learner)
        self.c.lags, self.c.ready, self.c.late, self.c.learner_scalars = [], [], [], {}
        self.c.loss_sum, self.c.loss_n = 0.0, 0
        self.last_log, self.last_log_steps, self.last_log_updates = now, self.c.env_steps, self.c.updates

    def _catch_up(self) -> None:
        """At an env-step stop, let the learner finish the updates this data is owed,
        so the update-to-data ratio holds exactly at the end of the run too."""
        deadline = time.time() + 120
        while time.time() < deadline and not self.learner_starved:
            inflight = getattr(self.roles, "updates_in_flight", lambda: 0)()
            if self.update_budget() <= 0 and inflight == 0:
                return
            for stats in self.roles.train(self.update_budget()):
                self._count_training(stats)
            time.sleep(0.002)

    def _finish(self, reason: str) -> dict:
        if reason == "max_env_steps":
            self._catch_up()
        getattr(self.roles, "sync_counters", lambda: None)()
        self.c.worker_restarts = getattr(self.roles, "restarts", 0)
        for stats in self.roles.train(0, final=True):
            self._count_training(stats)
        if reason != "solved":
            # A last score for runs that stopped early, so best_eval_return means something.
            if not self.roles.eval_busy() and self.c.updates > 0:
                self.roles.submit_eval(self.c.env_steps, wait=True)
            self._evaluate(block=True)
        self._log_row()
        persist.save(self)  # every stop leaves a resumable run (SIGTERM/SIGINT included)
        wall = time.time() - self.start
        lags = self.c.all_lags.values() if self.c.all_lags.seen else np.zeros(1)
        cfg = self.cfg
        summary = {
            "algo": cfg.algo, "env": cfg.env.id, "mode": cfg.mode,
            "workers": 1 if cfg.mode == "single" else cfg.workers, "seed": cfg.seed,
            "wall_s": round(wall, 3), "env_steps": self.c.env_steps, "updates": self.c.updates,
            "episodes": self.c.episodes, "env_steps_per_s": round(self.c.env_steps / max(wall, 1e-9), 1),
            "best_eval_return": self.c.best_eval if self.c.evaluations else None,
            "solved": self.c.solved_at is not None,
            "time_to_solve_s": round(self.c.solved_at, 3) if self.c.solved_at is not None else None,
            "stop_reason": reason, "evaluations": len(self.c.evaluations),
            "gradients_dropped": self.c.dropped, "worker_restarts": self.c.worker_restarts,
            "fragments_dropped": self.c.fragments_dropped, "env_errors": self.c.env_errors,
            "evaluator_restarts": getattr(self.roles, "evaluator_restarts", 0),
            "replay_restarts": getattr(self.roles, "replay_restarts", 0),
            "failure": self.failure,
            "policy_lag": {"mean": float(lags.mean()), "p50": float(np.percentile(lags, 50)),
                           "p90": float(np.percentile(lags, 90)), "max": float(lags.max())},
            "time_breakdown_s": {k: round(v, 3) for k, v in self.roles.time_breakdown().items()},
            "checkpoints": len(self.checkpoint_s),
            "checkpoint_s_max": round(max(self.checkpoint_s), 3) if self.checkpoint_s else None,
            "run_dir": self.run_dir,
        }
        save_json(os.path.join(self.run_dir, "summary.json"), summary)
        self.logger.close()
        return summary


def make_roles(cfg: Config, run_dir: str, start_time: float, address: str | None, eval_resume=None):
    if cfg.mode == "single":
        from distrl.runtime.local import LocalRoles

        return LocalRoles(cfg, run_dir, start_time, eval_resume)
    from distrl.runtime.cluster import RayRoles

    return RayRoles(cfg, run_dir, start_time, address, eval_resume)


def run_training(cfg: Config, run_dir: str, start_time: float, address: str | None = None) -> dict:
    """Write config.yaml, start the roles, drive them to a stop, write summary.json."""
    os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w") as fh:
        fh.write(dump_yaml(cfg))
    roles = make_roles(cfg, run_dir, start_time, address)
    return _drive(Driver(cfg, roles, run_dir, start_time), roles)


def resume_training(cfg: Config, run_dir: str, ckpt_path: str, state: dict, address: str | None = None) -> dict:
    """Continue a run from a checkpoint as if it had never stopped (wall time included)."""
    from distrl.run_checkpoint import restore_global_rng

    counters = persist.counters_from_meta(Counters, state["meta"]["counters"])
    start = time.time() - state["meta"]["wall_s"]
    eval_resume = {"evaluations": len(counters.evaluations), "best": counters.best_eval}
    roles = make_roles(cfg, run_dir, start, address, eval_resume)
    roles.set_state(state)
    restore_global_rng(state)
    with open(os.path.join(run_dir, "resumes.jsonl"), "a") as fh:
        fh.write(json.dumps({"checkpoint": ckpt_path, "env_steps": counters.env_steps, "updates": counters.updates,
                             "store_sha256": roles.store_digest(),
                             "resumed_at_wall_s": state["meta"]["wall_s"]}) + "\n")
    return _drive(Driver(cfg, roles, run_dir, start, counters), roles)


def _drive(driver: Driver, roles) -> dict:
    def on_signal(signum, frame):  # finish cleanly: checkpoint, summary and files still written
        driver.stop_requested = "interrupted"

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} \
        if _main_thread() else {}
    try:
        return driver.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        roles.close()


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
