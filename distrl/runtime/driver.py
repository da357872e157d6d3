"""The one driver loop. Modes differ only in the `Roles` object it drives (see `distrl.core.Roles`)."""
from __future__ import annotations

import os
import time

import numpy as np

from distrl.checkpoint import save_json
from distrl.config import Config
from distrl.core import Gathered, Roles, TrainStats, add_to_sums
from distrl.observe import MetricsLogger
from distrl.registry import on_policy
from distrl.replay.store import fragments_per_update
from distrl.runtime.counters import Counters
from distrl.runtime.snapshot import save_checkpoint


def _mean(xs) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


class Driver:
    def __init__(self, cfg: Config, roles: Roles, run_dir: str, start_time: float, counters: Counters | None = None):
        self.cfg, self.roles, self.run_dir, self.start = cfg, roles, run_dir, start_time
        self.c = counters or Counters()
        self.logger = MetricsLogger(run_dir, cfg.log.tensorboard, cfg.log.progress, append=counters is not None,
                                    total_steps=cfg.stop.max_env_steps, initial_steps=self.c.env_steps)
        self.checkpoint_s: list[float] = []
        self.last_checkpoint = time.time()
        self.stop_requested: str | None = None
        self.failure: str | None = None
        self.on_policy = on_policy(cfg.algo)
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
        return self.update_target() - self.c.consumed - self.roles.updates_in_flight()

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
            self._count_fragments(self.roles.gather(self.sampling_allowed()))
            for stats in self.roles.train(self.update_budget()):
                self._count_training(stats)
            self._evaluate()
            reason = self._stop_reason()
            if self._log_due() or reason:
                self._log_row()
            if not reason and time.time() - self.last_checkpoint >= self.cfg.checkpoint.interval_s:
                self.checkpoint_s.append(save_checkpoint(self))
                self.last_checkpoint = time.time()
        return self._finish(reason)

    def _count_fragments(self, gathered: Gathered) -> None:
        self.c.fragments_dropped += gathered.failed
        self.c.worker_restarts = self.roles.restarts().workers
        for info in gathered.infos:
            self.c.env_errors += info.env_errors
            self.c.env_steps += info.env_steps
            self.c.fragments += 1
            self.c.episodes += len(info.episode_returns)
            self.c.recent_returns = (self.c.recent_returns + list(info.episode_returns))[-100:]
        if gathered.ready or gathered.late:
            self.c.ready.append(gathered.ready)
            self.c.late.append(gathered.late)

    def _count_training(self, stats: TrainStats) -> None:
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
            self.c.evaluations += 1
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
        fault = self.cfg.fault
        if self.c.solved_at is not None:
            return "solved"
        if self.stop_requested:
            return self.stop_requested
        if self.c.worker_restarts > fault.max_worker_restarts:
            self.failure = (f"stopped: {self.c.worker_restarts} rollout-worker restarts exceed "
                            f"fault.max_worker_restarts={fault.max_worker_restarts}")
            return "worker_failures"
        if self.c.env_errors > fault.max_env_errors:
            self.failure = f"stopped: {self.c.env_errors} env exceptions exceed fault.max_env_errors={fault.max_env_errors}"
            return "env_errors"
        if time.time() - self.start >= self.cfg.stop.max_seconds:
            return "max_seconds"
        if self.cfg.stop.max_env_steps and self.c.env_steps >= self.cfg.stop.max_env_steps:
            return "max_env_steps"
        return None

    def _log_row(self) -> None:
        now = time.time()
        dt = max(now - self.last_log, 1e-9)
        c, ev = self.c, self.c.eval_last or {}
        row = {
            "wall_s": round(now - self.start, 3), "env_steps": c.env_steps, "updates": c.updates,
            "episodes": c.episodes,
            "env_steps_per_s": round((c.env_steps - self.last_log_steps) / dt, 1),
            "updates_per_s": round((c.updates - self.last_log_updates) / dt, 2),
            "train_return_mean": _mean(c.recent_returns),
            "eval_return_mean": ev.get("return_mean"), "eval_return_std": ev.get("return_std"),
            "best_eval_return": c.best_eval if c.evaluations else None,
            "policy_lag_mean": _mean(c.lags), "policy_lag_max": max(c.lags) if c.lags else None,
            "loss": c.loss_sum / c.loss_n if c.loss_n else None,
            "workers_ready_mean": _mean(c.ready), "workers_late_mean": _mean(c.late),
            "fragments_dropped": c.fragments_dropped, "worker_restarts": c.worker_restarts,
            "env_errors": c.env_errors, "gradients_dropped": c.dropped, "weight_version": c.version,
        }
        learner = {k: total / n for k, (total, n) in sorted(c.learner_scalars.items()) if n}
        self.logger.row(row, learner)
        c.lags, c.ready, c.late, c.learner_scalars = [], [], [], {}
        c.loss_sum, c.loss_n = 0.0, 0
        self.last_log, self.last_log_steps, self.last_log_updates = now, c.env_steps, c.updates

    def _catch_up(self) -> None:
        """At an env-step stop, let the learner finish the updates this data is owed,
        so the update-to-data ratio holds exactly at the end of the run too."""
        deadline = time.time() + 120
        while time.time() < deadline and not self.learner_starved:
            if self.update_budget() <= 0 and self.roles.updates_in_flight() == 0:
                return
            for stats in self.roles.train(self.update_budget()):
                self._count_training(stats)
            time.sleep(0.002)

    def _finish(self, reason: str) -> dict:
        if reason == "max_env_steps":
            self._catch_up()
        restarts = self.roles.restarts(exact=True)
        self.c.worker_restarts = restarts.workers
        for stats in self.roles.train(0, final=True):
            self._count_training(stats)
        if reason != "solved":
            # A last score for runs that stopped early, so best_eval_return means something.
            if not self.roles.eval_busy() and self.c.updates > 0:
                self.roles.submit_eval(self.c.env_steps, wait=True)
            self._evaluate(block=True)
        self._log_row()
        self.checkpoint_s.append(save_checkpoint(self))  # every stop leaves a resumable run
        summary = self._summary(reason, restarts)
        save_json(os.path.join(self.run_dir, "summary.json"), summary)
        self.logger.close()
        return summary

    def _summary(self, reason: str, restarts) -> dict:
        wall = time.time() - self.start
        lags = self.c.all_lags.values() if self.c.all_lags.seen else np.zeros(1)
        c, cfg = self.c, self.cfg
        return {
            "algo": cfg.algo, "env": cfg.env.id, "mode": cfg.mode,
            "workers": 1 if cfg.mode == "single" else cfg.workers, "seed": cfg.seed,
            "wall_s": round(wall, 3), "env_steps": c.env_steps, "updates": c.updates,
            "episodes": c.episodes, "env_steps_per_s": round(c.env_steps / max(wall, 1e-9), 1),
            "best_eval_return": c.best_eval if c.evaluations else None,
            "solved": c.solved_at is not None,
            "time_to_solve_s": round(c.solved_at, 3) if c.solved_at is not None else None,
            "stop_reason": reason, "evaluations": c.evaluations,
            "gradients_dropped": c.dropped, "worker_restarts": restarts.workers,
            "fragments_dropped": c.fragments_dropped, "env_errors": c.env_errors,
            "evaluator_restarts": restarts.evaluator, "replay_restarts": restarts.replay,
            "failure": self.failure,
            "policy_lag": {"mean": float(lags.mean()), "p50": float(np.percentile(lags, 50)),
                           "p90": float(np.percentile(lags, 90)), "max": float(lags.max())},
            "time_breakdown_s": {k: round(v, 3) for k, v in self.roles.time_breakdown().items()},
            "checkpoints": len(self.checkpoint_s),
            "checkpoint_s_max": round(max(self.checkpoint_s), 3) if self.checkpoint_s else None,
            "run_dir": self.run_dir,
        }
