"""The one driver loop. Modes differ only in the `Roles` object it drives (see `distrl.core.Roles`)."""
from __future__ import annotations

import os
import threading
import time
import traceback
from contextlib import nullcontext


from distrl.config import Config
from distrl.core import Gathered, RoleLost, RoleRestarted, Roles, Stopping, TrainStats, add_to_sums
from distrl.observe import MetricsLogger
from distrl.observe.trace import tracer
from distrl.observe.trace_segments import write_run_trace
from distrl.registry import on_policy
from distrl.runtime.pacing import pacing
from distrl.roles.evaluation import rank, save_best, saved_rank
from distrl.runtime.counters import Counters, HeldTime, note_restarts
from distrl.runtime.faultlog import FaultLog
from distrl.runtime.rows import metrics_row
from distrl.runtime.snapshot import save_checkpoint
from distrl.runtime.wind_down import WindDown, finish


FAILURE_LOG = "failure.log"  # the traceback of a fault that ended a run, for a bug report


def episode_log(cfg: Config, run_dir: str, append: bool):
    """log.dataset's writer: every episode the workers play, with the run's seed and config as metadata."""
    from distrl.config import to_dict
    from distrl.data.datasets import DatasetWriter
    from distrl.roles.factory import spec_of

    spec = spec_of(cfg.env, multi_agent=False)
    meta = {"source": "training", "algo": cfg.algo, "env": cfg.env.id, "seed": cfg.seed, "run_dir": run_dir,
            "config": to_dict(cfg)}
    return DatasetWriter(cfg.log.dataset, spec.observation_space, spec.action_space, meta, append=append)



def one_line(e: BaseException) -> str:
    """An exception as one short line: its first line, or its type when it has no message."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


class Driver:
    def __init__(self, cfg: Config, roles: Roles, run_dir: str, start_time: float, counters: Counters | None = None):
        self.cfg, self.roles, self.run_dir, self.start = cfg, roles, run_dir, start_time
        self.c = counters or Counters()
        self.logger = MetricsLogger(run_dir, cfg.log.tensorboard, cfg.log.progress, append=counters is not None,
                                    total_steps=cfg.stop.max_env_steps, initial_steps=self.c.env_steps,
                                    cfg=cfg)  # cfg for the trackers (log.wandb, log.mlflow)
        self.checkpoint_s: list[float] = []
        self.last_checkpoint = time.time()
        self.stop_requested: str | None = None
        self.stop_requested_at = self.solved_seen_at = None  # when a signal came, when the target was reached
        self.wind: WindDown | None = None  # from the stop on
        self.faults = FaultLog(run_dir, start_time)  # what the wind-down skipped: a line each
        roles.stop_due = self._stop_due  # its waits on roles end at the stop
        self.failure: str | None = None
        self.abort = False  # a second interrupt: wind down without waiting on anything
        self.interruptible = True  # False once only summary.json is left to write: later interrupts wait for it
        self.on_policy = on_policy(cfg.algo)
        self.offline = cfg.data.dataset is not None  # the replay holds a dataset: no workers, no rate limiter
        self.distributed = cfg.mode != "single"  # its gathers wait on other processes
        self.pacing = pacing(cfg)
        self.last_eval_submit = 0.0
        self.learner_starved = False
        self.last_eval_steps = self.c.env_steps
        self.last_log = self.last_log_steps = self.last_log_updates = None
        self.held = HeldTime(self.c, time.time())  # which side the loop held back, and for how long
        self.best_rank = saved_rank(run_dir)
        self.dataset = episode_log(cfg, run_dir, append=counters is not None) if cfg.log.dataset else None

    # --- budget: the rate limiter (replay) or one update per batch of fragments (on-policy) ---
    def update_budget(self, exact: bool = False) -> int:
        """Updates the learner may start now (`exact`: hold the ratio with no buffer, for a run's end)."""
        inflight = self.roles.updates_in_flight()
        if self.offline:  # as many as a learner call takes: the data never runs out
            return 4 * self.cfg.learner.batches_per_call - inflight
        if self.on_policy:  # each fragment is used exactly once
            return self.c.fragments // self.pacing.fragments_per_update - self.c.consumed - inflight
        limiter = self.pacing.rate_limiter(self.c.inserts, self.c.samples, exact)
        return limiter.sample_allowance() // self.cfg.learner.batch_size - inflight

    def sampling_allowed(self) -> bool:
        """Workers are held back while the learner is behind (the rate limiter, or a full FIFO)."""
        if self.offline:
            return False
        if self.on_policy:
            return self.c.fragments - self.c.consumed * self.pacing.fragments_per_update < self.cfg.queue.capacity
        # Room for one more item is enough: a gather then overshoots by at most its own size, and asking
        # for room for a whole burst of items could exceed what the buffer ever frees (a deadlock).
        limiter = self.pacing.rate_limiter(self.c.inserts, self.c.samples)
        return self.learner_starved or limiter.can_insert(1)

    def _tick(self, workers_held: bool, learner_held: bool) -> None:
        """Charge the time since the last pass to whichever side was held back during it."""
        self.held.passed(time.time(), workers_held, learner_held)

    # --- the loop ---------------------------------------------------------------
    def run(self) -> dict:
        self.last_log = time.time()
        self.last_log_steps, self.last_log_updates = self.c.env_steps, self.c.updates
        reason = None
        tr = tracer()
        try:
            reason = self._loop(tr)
        except RoleLost as e:  # a role could not come back: end here, with what can still be saved
            self.failure, reason = f"stopped: {e}", "role_failure"
        except KeyboardInterrupt:  # a second Ctrl-C or SIGTERM: end now
            self.failure, reason = "stopped at once by a second interrupt", "interrupted"
            self.abort = True
        except Exception as e:  # noqa: BLE001 - a fault no recovery covers: still a checkpoint and a summary
            self.failure, reason = f"stopped: {one_line(e)} (traceback in {FAILURE_LOG})", "error"
            with open(os.path.join(self.run_dir, FAILURE_LOG), "w") as fh:
                traceback.print_exc(file=fh)
        return self._finish(reason)

    def _loop(self, tr) -> str:
        reason, held = None, None  # held: the open `learner_held` span while the rate limiter holds the learner
        while reason is None:
            try:
                allowed = self.sampling_allowed()
                with tr.span("gather" if allowed else "backpressure", "wait") if self.distributed else nullcontext():
                    self._count_fragments(self.roles.gather(allowed))
                budget = self.update_budget()
                if budget > 0 and held is not None:  # released: the span ends before the updates it allows
                    tr.end(held)
                    held = None
                for stats in self.roles.train(budget):
                    self._count_training(stats)
                learner_held = budget <= 0 and self.roles.updates_in_flight() == 0
                if learner_held and not self.on_policy and held is None:
                    # Its own track: the hold outlasts the gathers and logs the driver thread does meanwhile.
                    held = tr.begin("learner_held", "wait", track="rate limiter")
                self._tick(workers_held=not allowed, learner_held=learner_held)
                self._evaluate()
            except Stopping:  # the stop came while a role was waited on: the pass ends there
                self._count_results(self.roles.poll_eval())
            reason = self._stop_reason()
            if self._log_due() or reason:
                with tr.span("log", "driver"):
                    self._log_row()
            if not reason and time.time() - self.last_checkpoint >= self.cfg.checkpoint.interval_s:
                try:
                    self._checkpoint()
                except Stopping:  # cut short by the stop (nothing of it is left): the wind-down takes one
                    reason = self._stop_reason()
        tr.end(held)
        return reason

    def _count_fragments(self, gathered: Gathered) -> None:
        self.c.fragments_dropped += gathered.failed
        note_restarts(self.c, self.roles.restarts())
        self.c.inserts += sum(info.items for info in gathered.infos)
        for info in gathered.infos:
            for name, n in info.counts.items():  # a simulator server's (clients: a gauge)
                self.c.external[name] = n if name == "clients" else self.c.external.get(name, 0) + n
            if not info.env_steps:  # a simulator server's call that found no fragment
                continue
            if self.dataset is not None:
                self.dataset.add(info.episodes)
            self.c.env_errors += info.env_errors
            self.c.env_steps += info.env_steps
            self.c.fragments += 1
            self.c.episodes += len(info.episode_returns)
            self.c.recent_returns = (self.c.recent_returns + list(info.episode_returns))[-100:]
        if gathered.ready or gathered.late:
            self.c.ready.append(gathered.ready)
            self.c.late.append(gathered.late)

    def _count_training(self, stats: TrainStats) -> None:
        if stats.rewound_to is not None:
            self._rewind(stats.rewound_to)
            return
        self.learner_starved = stats.starved
        self.c.updates += stats.updates
        self.c.consumed += stats.consumed
        self.c.nonfinite_updates += stats.nonfinite
        self.c.nonfinite_streak = stats.nonfinite_tail if stats.updates else self.c.nonfinite_streak + stats.nonfinite
        self.c.poisoned |= stats.poisoned
        self.c.samples += stats.consumed * self.cfg.learner.batch_size
        self.c.dropped += stats.dropped
        self.c.version = max(self.c.version, stats.version)
        self.c.lags.extend(stats.lags)
        self.c.all_lags.extend(stats.lags)
        self.c.loss_sum += stats.loss_sum
        for k, (total, n) in stats.scalars.items():
            add_to_sums(self.c.learner_scalars, k, total, n)
        self.c.loss_n += stats.updates

    def _rewind(self, updates: int) -> None:
        """A restarted learner was restored to `updates`: what it did since is lost, and counted as such;
        the rate limiter owes it those samples again, on the data gathered since."""
        c = self.c
        lost = max(0, c.updates - updates)
        c.updates_lost += lost
        c.updates, c.version = updates, min(c.version, updates)
        c.consumed = max(0, c.consumed - lost)
        c.samples = max(0, c.samples - lost * self.cfg.learner.batch_size)

    def _log_due(self) -> bool:
        every = self.cfg.log.interval_steps
        if every:  # step-based rows land on the same env_steps in every deterministic run
            return self.c.env_steps // every > self.last_log_steps // every
        return time.time() - self.last_log >= self.cfg.log.interval_s

    def _evaluate(self, block: bool = False) -> None:
        self._count_results(self.roles.poll_eval(block=block, timeout=60.0))
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

    def _count_results(self, results: list[dict]) -> None:
        for result in results:
            self.logger.eval_result(result)  # an evaluation's video (eval.video_every_s), taken out
            self._keep_if_best(result)
            self.c.eval_last = result
            self.c.evaluations += 1
            self.c.best_eval = max(self.c.best_eval, result["return_mean"])
            if result["solved"] and self.c.solved_at is None:
                self.c.solved_at, self.solved_seen_at = result["time_s"], time.time()

    def _keep_if_best(self, result: dict) -> None:
        """The run's best checkpoint, written here only: it only improves, whichever evaluator process
        scored it and on whichever node."""
        weights = result.pop("weights", None)
        if weights is not None and rank(result) > self.best_rank:
            self.best_rank = rank(result)
            save_best(self.run_dir, weights, result)

    def request_stop(self, reason: str) -> None:
        """A stop from outside the loop (a signal): the run winds down, timed from this moment."""
        if not self.stop_requested:
            self.stop_requested, self.stop_requested_at = reason, time.time()

    def _stop_due(self) -> bool:
        """The run's budget is spent or a stop was asked for: what the roles' waits look at every second."""
        return bool(self.stop_requested) or time.time() - self.start >= self.cfg.stop.max_seconds

    def _stop_moment(self, reason: str) -> float:
        """When the run stopped: its budget's end, the signal, the solving evaluation; else now."""
        at = {"max_seconds": self.start + self.cfg.stop.max_seconds, "interrupted": self.stop_requested_at,
              "solved": self.solved_seen_at}.get(reason)
        return min(at or time.time(), time.time())

    def _stop_reason(self) -> str | None:
        fault = self.cfg.fault
        if self.c.solved_at is not None:
            return "solved"
        if self.stop_requested:
            return self.stop_requested
        if self.logger.stop_request:  # a sweep's scheduler stopped this run early (RUN_DIR/stop_request.json)
            return self.logger.stop_request
        if self.c.worker_restarts > fault.max_worker_restarts:
            self.failure = (f"stopped: {self.c.worker_restarts} rollout-worker restarts exceed "
                            f"fault.max_worker_restarts={fault.max_worker_restarts}")
            return "worker_failures"
        if self.c.poisoned:
            self.failure = "stopped: the learner's weights hold a NaN or inf; they were never published or checkpointed"
            return "nonfinite"
        if self.c.nonfinite_streak >= fault.max_nonfinite_updates:
            self.failure = (f"stopped: {self.c.nonfinite_streak} updates in a row had a NaN or inf loss or gradient "
                            f"(fault.max_nonfinite_updates={fault.max_nonfinite_updates}); none changed the weights")
            return "nonfinite"
        if self.c.env_errors > fault.max_env_errors:
            self.failure = f"stopped: {self.c.env_errors} env exceptions exceed fault.max_env_errors={fault.max_env_errors}"
            return "env_errors"
        if time.time() - self.start >= self.cfg.stop.max_seconds:
            return "max_seconds"
        if self.cfg.stop.max_env_steps and self.c.env_steps >= self.cfg.stop.max_env_steps:
            return "max_env_steps"
        if self.cfg.stop.max_updates and self.c.updates >= self.cfg.stop.max_updates:
            return "max_updates"
        return None

    def _log_row(self) -> None:
        now = time.time()
        row, learner = metrics_row(self, now)
        self.logger.row(row, learner)
        c = self.c
        c.lags, c.ready, c.late, c.learner_scalars = [], [], [], {}
        c.loss_sum, c.loss_n = 0.0, 0
        self.last_log, self.last_log_steps, self.last_log_updates = now, c.env_steps, c.updates

    def _catch_up(self) -> None:
        """At an env-step stop, let the learner finish the updates this data is owed,
        so the update-to-data ratio holds exactly at the end of the run too."""
        deadline = time.time() + 120
        while time.time() < deadline and not self.learner_starved:
            if self.update_budget(exact=True) <= 0 and self.roles.updates_in_flight() == 0:
                return
            for stats in self.roles.train(self.update_budget(exact=True)):
                self._count_training(stats)
            time.sleep(0.002)

    def _finish(self, reason: str) -> dict:
        return finish(self, reason)

    def _replay_bytes(self) -> float | None:
        try:
            return self.roles.replay_bytes_per_item()
        except Exception:  # noqa: BLE001 - a figure for the summary is no reason to fail a finished run
            return None

    def _attempt(self, step, within_s: float | None = None, raise_stop: bool = False):
        """Run one wind-down step; a failure is recorded, not raised (the summary must still be written);
        `raise_stop`: a step cut short (`Stopping`) is raised, for the wind-down to say it was skipped."""
        if within_s is not None:
            thread = threading.Thread(target=self._attempt, args=(step,), daemon=True)
            thread.start()
            thread.join(within_s)
            return None
        try:
            return step()
        except Stopping:
            if raise_stop:
                raise
            return None
        except Exception as e:  # noqa: BLE001 - a fault mid-way through the wind-down
            self.failure = self.failure or f"stopped: {one_line(e)}"
            return None

    def _checkpoint(self, attempts: int = 1) -> None:
        for attempt in range(attempts):
            try:
                with tracer().span("checkpoint", "checkpoint"):
                    took = save_checkpoint(self)
                break
            except RoleRestarted:  # a role died while its state was taken: it is back, so try again
                if attempt == attempts - 1:
                    return  # at the next pass
        if took is None:
            self.c.poisoned = True  # the run stops at the next pass; the newest checkpoint is the last good one
        else:
            self.checkpoint_s.append(took)
        self.last_checkpoint = time.time()

    def _write_trace(self) -> None:
        """RUN_DIR/trace.json from every process's ring (`distrl timeline` / `distrl report` read it),
        after the earlier segments' events when this run was resumed."""
        drained = self.roles.traces()
        if drained:
            write_run_trace(self.run_dir, drained, self.start,
                            {"mode": self.cfg.mode, "algo": self.cfg.algo, "env": self.cfg.env.id})

