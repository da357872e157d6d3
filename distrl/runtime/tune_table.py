"""The table of a sweep's trials: the values each tried, its metric, time to solve and how it ended,
best first; printed by `distrl tune` and written to SWEEP_DIR/trials.csv."""
from __future__ import annotations

import csv
import json
import math
import os

from distrl.runtime.tune_trial import trial_run_dir


def _summary(run_dir: str) -> dict:
    try:
        with open(os.path.join(run_dir, "summary.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _last_row(run_dir: str) -> dict:
    try:
        with open(os.path.join(run_dir, "metrics.csv"), newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError:
        return {}
    return rows[-1] if rows else {}


def _float(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def trial_row(spec: dict, result) -> dict:
    """One trial's line, from its Tune result and its run dir."""
    trial_id = os.path.basename(os.path.normpath(result.path))
    run_dir = trial_run_dir(spec["dir"], trial_id, result.config)
    summary, metric = _summary(run_dir), spec["metric"]
    value = summary.get(metric) if metric in summary else _last_row(run_dir).get(metric)
    if result.error is not None:
        ended = "error: " + (" ".join(str(result.error).split()) or type(result.error).__name__)[-200:]
    else:
        ended = summary.get("stop_reason") or "not finished"
    return {"trial": trial_id, **{k: result.config.get(k) for k, _ in spec["axes"]}, metric: _float(value),
            "time_to_solve_s": summary.get("time_to_solve_s"), "env_steps": summary.get("env_steps"),
            "stop_reason": ended, "run_dir": os.path.relpath(run_dir, spec["dir"])}


def sweep_table(spec: dict, grid) -> list[dict]:
    """Every trial of `grid` (a Tune ResultGrid), best first by the sweep's metric (trials without one last)."""
    rows = [trial_row(spec, result) for result in grid]
    metric = spec["metric"]
    return sorted(rows, key=lambda r: (r[metric] is None, -(r[metric] or 0.0), r["trial"]))


def write_table(sweep_dir: str, rows: list[dict]) -> str:
    path = os.path.join(sweep_dir, "trials.csv")
    if rows:
        with open(path + ".tmp", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        os.replace(path + ".tmp", path)
    return path


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_table(rows: list[dict]) -> str:
    """The rows as aligned text columns (run dirs last)."""
    if not rows:
        return "no trials"
    cols = list(rows[0])
    cells = [[_cell(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in cells]
    return "\n".join(lines)
