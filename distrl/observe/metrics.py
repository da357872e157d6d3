"""metrics.csv rows, learner.jsonl diagnostics, TensorBoard scalars, a console progress line, the
experiment trackers (log.wandb, log.mlflow), evaluation videos (eval.video_every_s), and a sweep's request
to stop the run early (RUN_DIR/stop_request.json)."""
from __future__ import annotations

import csv
import json
import math
import os
import sys

METRIC_COLUMNS = [
    "wall_s", "env_steps", "updates", "episodes", "env_steps_per_s", "updates_per_s",
    "train_return_mean", "eval_return_mean", "eval_return_std", "eval_success_rate", "best_eval_return",
    "policy_lag_mean", "policy_lag_max", "loss", "workers_ready_mean", "workers_late_mean",
    "fragments_dropped", "worker_restarts", "env_errors", "gradients_dropped", "weight_version",
    "nonfinite_updates", "workers_blocked_frac", "learner_blocked_frac",
]


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _nonfinite(row: dict) -> str:
    n = row.get("nonfinite_updates") or 0
    return f"  non-finite updates skipped {n}" if n else ""


STOP_REQUEST = "stop_request.json"  # RUN_DIR/stop_request.json: {"reason": ...} ends the run at its next row
VIDEOS = "videos"  # RUN_DIR/videos/: the evaluation videos (eval.video_every_s)


def request_stop(run_dir: str, reason: str, **detail) -> None:
    """Ask the run in `run_dir` to stop at its next metrics row, with stop_reason `reason` (a sweep's
    scheduler stopping a trial early): it ends as at any stop, with a checkpoint and summary.json."""
    os.makedirs(run_dir, exist_ok=True)
    tmp = os.path.join(run_dir, STOP_REQUEST + ".tmp")
    with open(tmp, "w") as fh:
        json.dump({"reason": reason, **detail}, fh)
    os.replace(tmp, os.path.join(run_dir, STOP_REQUEST))


def read_stop_request(run_dir: str) -> str | None:
    try:
        with open(os.path.join(run_dir, STOP_REQUEST)) as fh:
            reason = json.load(fh).get("reason")
    except (OSError, ValueError, AttributeError):
        return None
    return str(reason) if reason else None


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


class MetricsLogger:
    def __init__(self, run_dir: str, tensorboard: bool, progress: bool, append: bool = False,
                 total_steps: int | None = None, initial_steps: int = 0, cfg=None):
        self.run_dir = run_dir
        self.stop_request = read_stop_request(run_dir)  # the stop_reason a sweep asked for, or None
        self.path = os.path.join(run_dir, "metrics.csv")
        append = append and os.path.exists(self.path)  # a resumed run continues the same file
        self._fh = open(self.path, "a" if append else "w", newline="")
        self._csv = csv.DictWriter(self._fh, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
        if not append:
            self._csv.writeheader()
        self._fh.flush()
        # The learner's own diagnostics differ per algorithm, so they get a schema-free file.
        self._learner_fh = open(os.path.join(run_dir, "learner.jsonl"), "a" if append else "w")
        self.progress_lines = progress and not sys.stderr.isatty()  # plain lines when not a terminal
        self._bar = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, unit=" steps", dynamic_ncols=True, leave=True,
                             initial=initial_steps, desc="train")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # heavy import: only when asked

            self._tb = SummaryWriter(os.path.join(run_dir, "tb"))
        self.trackers = None
        if cfg is not None and (cfg.log.wandb is not None or cfg.log.mlflow is not None):
            from distrl.config import to_dict
            from distrl.observe.trackers import Trackers

            self.trackers = Trackers(cfg.log, to_dict(cfg), run_dir, resumed=append)
        self._video_warned = False

    def row(self, row: dict, learner: dict[str, float] | None = None) -> None:
        """One log interval: `row` has METRIC_COLUMNS; `learner` the means of the learner's scalars."""
        self._csv.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in METRIC_COLUMNS})
        self._fh.flush()
        if learner:
            where = {k: row[k] for k in ("wall_s", "env_steps", "updates")}
            self._learner_fh.write(json.dumps({**where, **learner}) + "\n")
            self._learner_fh.flush()
        if self._tb is not None:
            step = int(row["env_steps"])
            for k in METRIC_COLUMNS[3:]:
                v = row.get(k)
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    self._tb.add_scalar(k, v, step)
            for k, v in (learner or {}).items():
                self._tb.add_scalar(f"learner/{k}", v, step)
        if self.trackers is not None:
            self.trackers.row(row, learner)
        self.stop_request = self.stop_request or read_stop_request(self.run_dir)
        self._progress(row)

    def eval_result(self, result: dict) -> None:
        """An evaluation's result as it arrives: its video, if it has one, is taken out of it (it is not kept
        with the counters) and written to RUN_DIR/videos/, TensorBoard (a GIF) and the trackers."""
        video = result.pop("video", None)
        if not video:
            return
        if "error" in video:
            if not self._video_warned:
                print(f"distrl: warning: no evaluation videos: {video['error']}", file=sys.stderr, flush=True)
                self._video_warned = True
            return
        from distrl.observe.video import tensorboard_gif

        step = int(result.get("env_steps", 0))
        stem = os.path.join(self.run_dir, VIDEOS, f"eval_{step:010d}_v{int(result.get('version', 0))}")
        path, n = stem + ".mp4", 1
        while os.path.exists(path):  # the same weights scored again (a run's last evaluation): another episode
            n += 1
            path = f"{stem}_{n}.mp4"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as fh:
            fh.write(video["mp4"])
        os.replace(path + ".tmp", path)
        if self._tb is not None:
            tensorboard_gif(self._tb, "eval/video", video["gif"], *video["gif_size"], step)
        if self.trackers is not None:
            self.trackers.video(path, step)

    def _progress(self, row: dict) -> None:
        if self._bar is not None:
            self._bar.update(row["env_steps"] - self._bar.n)
            self._bar.set_postfix_str(
                f"{_fmt(row['env_steps_per_s'])} steps/s, updates {row['updates']} ({_fmt(row['updates_per_s'])}/s), "
                f"eval {_fmt(row.get('eval_return_mean'))}, lag {_fmt(row.get('policy_lag_mean'))}, "
                f"blocked w/l {_pct(row.get('workers_blocked_frac'))}/{_pct(row.get('learner_blocked_frac'))}"
                f"{_nonfinite(row)}", refresh=True)
        elif self.progress_lines:
            print(f"{row['wall_s']:6.1f}s  steps {row['env_steps']:>8}  {_fmt(row['env_steps_per_s'])} steps/s  "
                  f"updates {row['updates']:>6} ({_fmt(row['updates_per_s'])}/s)  "
                  f"eval {_fmt(row.get('eval_return_mean'))}  lag {_fmt(row.get('policy_lag_mean'))}  "
                  f"blocked w/l {_pct(row.get('workers_blocked_frac'))}/{_pct(row.get('learner_blocked_frac'))}"
                  f"{_nonfinite(row)}", file=sys.stderr, flush=True)

    def close(self, summary: dict | None = None) -> None:
        """End the logs; `summary` (the run's summary.json) goes to the trackers with the best checkpoint."""
        if self.trackers is not None:
            self.trackers.finish(summary)
        if summary is not None and self.stop_request and summary.get("stop_reason") == self.stop_request:
            os.replace(os.path.join(self.run_dir, STOP_REQUEST), os.path.join(self.run_dir, STOP_REQUEST + ".done"))
        if self._bar is not None:
            self._bar.close()
        self._fh.close()
        self._learner_fh.close()
        if self._tb is not None:
            self._tb.close()
