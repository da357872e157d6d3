"""What a run reports: a metrics row while it runs, its summary when it ends (read off the driver)."""
from __future__ import annotations

import time

import numpy as np

from distrl.core import NONFINITE


def _mean(xs) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def metrics_row(d, now: float) -> tuple[dict, dict]:
    """(the metrics.csv row since the last one, the learner's averaged diagnostics) of driver `d`."""
    dt = max(now - d.last_log, 1e-9)
    c, ev = d.c, d.c.eval_last or {}
    workers_held, learner_held = d.held.shares(now)
    row = {
        "wall_s": round(now - d.start, 3), "env_steps": c.env_steps, "updates": c.updates,
        "episodes": c.episodes,
        "env_steps_per_s": round((c.env_steps - d.last_log_steps) / dt, 1),
        "updates_per_s": round((c.updates - d.last_log_updates) / dt, 2),
        "train_return_mean": _mean(c.recent_returns),
        "eval_return_mean": ev.get("return_mean"), "eval_return_std": ev.get("return_std"),
        "eval_success_rate": (ev.get("metrics") or {}).get("success_rate"),
        "best_eval_return": c.best_eval if c.evaluations else None,
        "policy_lag_mean": _mean(c.lags), "policy_lag_max": max(c.lags) if c.lags else None,
        "loss": c.loss_sum / c.loss_n if c.loss_n else None,
        "workers_ready_mean": _mean(c.ready), "workers_late_mean": _mean(c.late),
        "fragments_dropped": c.fragments_dropped, "worker_restarts": c.worker_restarts,
        "env_errors": c.env_errors, "gradients_dropped": c.dropped, "weight_version": c.version,
        "nonfinite_updates": c.nonfinite_updates,
        "workers_blocked_frac": round(workers_held, 3), "learner_blocked_frac": round(learner_held, 3),
    }
    learner = {k: total if k.startswith(NONFINITE) else total / n for k, (total, n) in sorted(c.learner_scalars.items()) if n}
    return row, learner


def rate_summary(d, wall: float) -> dict:
    """Which side waited for the other, and the ratio that held."""
    c = d.c
    out = {"workers_blocked_s": round(c.workers_blocked_s, 3), "learner_blocked_s": round(c.learner_blocked_s, 3),
           "workers_blocked_frac": round(c.workers_blocked_s / max(wall, 1e-9), 3),
           "learner_blocked_frac": round(c.learner_blocked_s / max(wall, 1e-9), 3)}
    if not d.on_policy and not d.offline:
        limiter = d.pacing.rate_limiter(c.inserts, c.samples)
        ratio = limiter.observed_ratio()
        out.update(inserts=c.inserts, samples=c.samples, samples_per_insert=d.cfg.replay.samples_per_insert,
                   samples_per_insert_observed=None if ratio is None else round(ratio, 3),
                   error_buffer=limiter.error_buffer)
    return out


def run_summary(d, reason: str, restarts, replay_bytes: float | None = None) -> dict:
    """summary.json of driver `d`'s run, ended for `reason`, with the roles' `restarts` and the replay's
    real `replay_bytes` per stored item."""
    wall = time.time() - d.start
    lags = d.c.all_lags.values() if d.c.all_lags.seen else None
    c, cfg = d.c, d.cfg
    policy_lag = None if lags is None else {"mean": float(lags.mean()), "p50": float(np.percentile(lags, 50)),
                                           "p90": float(np.percentile(lags, 90)), "max": float(lags.max())}
    return {
        "algo": cfg.algo, "env": cfg.env.id, "mode": cfg.mode,
        "workers": 0 if d.offline else 1 if cfg.mode == "single" else cfg.workers, "seed": cfg.seed,
        "wall_s": round(wall, 3), "env_steps": c.env_steps, "updates": c.updates,
        "episodes": c.episodes, "env_steps_per_s": round(c.env_steps / max(wall, 1e-9), 1),
        "best_eval_return": c.best_eval if c.evaluations else None,
        "solved": c.solved_at is not None,
        "time_to_solve_s": round(c.solved_at, 3) if c.solved_at is not None else None,
        "stop_reason": reason, "evaluations": c.evaluations,
        "gradients_dropped": c.dropped, "nonfinite_updates": c.nonfinite_updates, "worker_restarts": restarts.workers,
        "fragments_dropped": c.fragments_dropped, "env_errors": c.env_errors,
        "evaluator_restarts": restarts.evaluator, "replay_restarts": restarts.replay,
        "replay_refilled_items": restarts.replay_refilled,
        "learner_restarts": restarts.learner, "parameter_server_restarts": restarts.parameter_server,
        "inference_restarts": restarts.inference, "gradient_worker_restarts": restarts.gradient_workers,
        "workers_lost": restarts.workers_lost, "updates_lost": c.updates_lost,
        "external_restarts": restarts.external, "external": dict(c.external) if cfg.external.enabled else None,
        "failure": d.failure,
        "policy_lag": policy_lag,
        "rate_limiter": rate_summary(d, wall),
        "dataset": cfg.data.dataset,
        "replay_bytes_per_item": None if replay_bytes is None else round(replay_bytes, 1),
        "time_breakdown_s": {k: round(v, 3) for k, v in d.roles.time_breakdown().items()},
        "checkpoints": len(d.checkpoint_s),
        "checkpoint_s_max": round(max(d.checkpoint_s), 3) if d.checkpoint_s else None,
        "run_dir": d.run_dir,
    }
