"""`distrl plot`: learning curves from runs' metrics.csv, grouped by config, drawn as medians with bands.

Runs whose config.yaml names the same algo, env and mode form a group. Each run's greedy eval
return is held from one metrics row to the next (a step function: the value the run would report
at that moment) and read at every moment any run of the group logged, so runs logged at different
moments combine exactly; a run contributes only up to its own last row, and the median is drawn
where at least half the group's runs have a value. The band is min-max, or the
interquartile range once a group has IQR_RUNS runs, where the extremes would say more about one
outlier than about the group.

A sweep dir (`distrl tune`'s, with sweep.json) stands for its trials: they are grouped by the values they
tried of the swept keys other than `seed`, so the seeds of one config make one median and band. A trial
stopped before its first evaluation has no curve and is left out.
"""
from __future__ import annotations

import csv
import json
import math
import os

import numpy as np
import yaml

from distrl.observe.rundir import RunDataError, run_file
from distrl.observe.timeline import save_png

IQR_RUNS = 4
MAX_POINTS = 2000
SIZE_PX = (1400, 620)
# Fixed margins in pixels, so labels and the legend below the panels never overlap the curves.
TOP_PX, BOTTOM_PX, LEFT_PX, RIGHT_PX = 50, 125, 80, 30


def _floats(rows: list[dict], key: str) -> np.ndarray:
    return np.array([float(r[key]) for r in rows], float)


def _eval_rows(path: str) -> list[dict]:
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as e:
        raise RunDataError(f"cannot read {path}: {e}") from None
    keep = []
    for r in rows:
        try:
            if math.isfinite(float(r.get("eval_return_mean") or "nan")):
                float(r["wall_s"]), float(r["env_steps"])
                keep.append(r)
        except (TypeError, ValueError, KeyError):
            continue  # a malformed row (a run killed mid-write) is skipped, not fatal
    return keep


def _run_config(run_dir: str) -> tuple[tuple[str, str, str], float | None]:
    """(algo, env, mode) and the target return, from config.yaml, else summary.json."""
    cfg, summary = {}, {}
    try:
        with open(os.path.join(run_dir, "config.yaml")) as fh:
            cfg = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError):
        pass
    try:
        with open(os.path.join(run_dir, "summary.json")) as fh:
            summary = json.load(fh)
    except (OSError, ValueError):
        pass
    env = (cfg.get("env") or {}).get("id") if isinstance(cfg.get("env"), dict) else None
    key = (str(cfg.get("algo") or summary.get("algo") or "?"), str(env or summary.get("env") or "?"),
           str(cfg.get("mode") or summary.get("mode") or "?"))
    target = (cfg.get("eval") or {}).get("target_return") if isinstance(cfg.get("eval"), dict) else None
    return key, None if target is None else float(target)


def read_run(run_dir: str) -> dict:
    """One run's eval curve and its group key; RunDataError when the run dir cannot give one."""
    path = run_file(run_dir, "metrics.csv")
    rows = _eval_rows(path)
    if not rows:
        raise RunDataError(f"{path} has no eval_return_mean values yet")
    key, target = _run_config(run_dir)
    return {"run_dir": run_dir, "key": key, "target": target, "wall_s": _floats(rows, "wall_s"),
            "env_steps": _floats(rows, "env_steps"), "ret": _floats(rows, "eval_return_mean")}


def read_sweep(sweep_dir: str) -> list[dict]:
    """The trials of a sweep dir with an eval curve, each keyed by its values of the swept keys but seed."""
    try:
        with open(os.path.join(sweep_dir, "sweep.json")) as fh:
            keys = [axis[0] for axis in json.load(fh)["axes"] if axis[0] != "seed"]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        raise RunDataError(f"{sweep_dir}/sweep.json cannot be read") from None
    runs = []
    root = os.path.join(sweep_dir, "runs")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        try:
            run = read_run(os.path.join(root, name))
            with open(os.path.join(root, name, "trial.json")) as fh:
                values = json.load(fh)["config"]
        except (RunDataError, OSError, ValueError, KeyError):
            continue  # no evaluation yet (stopped early, or still starting)
        if keys:
            run["key"] = tuple((k, values.get(k)) for k in keys)
        runs.append(run)
    if not runs:
        raise RunDataError(f"{sweep_dir}: no trial of this sweep has eval_return_mean values yet")
    return runs


def is_sweep(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "sweep.json"))


def group_runs(runs: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault(run["key"], []).append(run)
    return groups


def group_curve(runs: list[dict], x_key: str, max_points: int = MAX_POINTS) -> dict:
    """Median and band of the group's step-held returns on the union of the runs' `x_key` values."""
    grid = np.unique(np.concatenate([r[x_key] for r in runs]))
    if len(grid) > max_points:  # a long run logged every second: a curve needs no more points than pixels
        grid = grid[np.linspace(0, len(grid) - 1, max_points).round().astype(int)]
    values = np.full((len(runs), len(grid)), np.nan)
    for i, r in enumerate(runs):
        x = r[x_key]
        idx = np.searchsorted(x, grid, side="right") - 1
        alive = (idx >= 0) & (grid <= x[-1])
        values[i, alive] = r["ret"][idx[alive]]
    # The median of a group is drawn where at least half its runs have a value: before that it
    # would jump around as the first few runs report.
    seen = (~np.isnan(values)).sum(axis=0) * 2 >= len(runs)
    grid, values = grid[seen], values[:, seen]
    if len(runs) >= IQR_RUNS:
        low, high = np.nanpercentile(values, 25, axis=0), np.nanpercentile(values, 75, axis=0)
    else:
        low, high = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
    return {"x": grid, "median": np.nanmedian(values, axis=0), "low": low, "high": high}


def _label(key: tuple, runs: list[dict]) -> str:
    n = len(runs)
    band = "" if n == 1 else (", IQR band" if n >= IQR_RUNS else ", min-max band")
    if key and isinstance(key[0], tuple):  # a sweep's config: its values of the swept keys
        name = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in key)
    else:
        name = " · ".join(key)
    return f"{name} ({n} run{'s' if n > 1 else ''}{band})"


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w, h = SIZE_PX
    fig = Figure(figsize=(w / 100, h / 100), dpi=100)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=LEFT_PX / w, right=1 - RIGHT_PX / w, top=1 - TOP_PX / h, bottom=BOTTOM_PX / h,
                        wspace=0.18)
    return fig, fig.subplots(1, 2, sharey=True)


def _draw_groups(axes, groups: dict[tuple, list[dict]]) -> list:
    import matplotlib

    colors = matplotlib.colormaps["tab10"].colors
    handles = []
    for i, (key, runs) in enumerate(groups.items()):
        color = colors[i % len(colors)]
        for ax, x_key in zip(axes, ("wall_s", "env_steps")):
            c = group_curve(runs, x_key)
            few = len(runs) == 1 and len(c["x"]) <= 40  # markers show where a short run's evaluations are
            (line,) = ax.plot(c["x"], c["median"], color=color, lw=1.8, label=_label(key, runs),
                              drawstyle="steps-post", marker="o" if few else None, markersize=3.5)
            if len(runs) > 1:
                ax.fill_between(c["x"], c["low"], c["high"], color=color, alpha=0.18, lw=0, step="post")
        handles.append(line)
    return handles


def _draw_targets(axes, groups: dict[tuple, list[dict]]) -> list:
    targets = sorted({r["target"] for runs in groups.values() for r in runs if r["target"] is not None})
    handles = []
    for t in targets:
        for ax in axes:
            line = ax.axhline(t, color="#555555", ls="--", lw=1, label=f"target return {t:g}")
        handles.append(line)
    return handles


def draw_plot(runs: list[dict], out_path: str) -> str:
    from matplotlib.ticker import EngFormatter

    groups = group_runs(runs)
    fig, axes = _figure()
    handles = _draw_groups(axes, groups) + _draw_targets(axes, groups)
    axes[0].set_xlabel("wall time, s")
    axes[1].set_xlabel("env steps")
    axes[1].xaxis.set_major_formatter(EngFormatter(sep=""))
    axes[0].set_ylabel("greedy eval return")
    for ax in axes:
        ax.set_xlim(left=0)
        ax.grid(color="#eeeeee", lw=0.8)
    fig.suptitle("greedy eval return: median per group of runs", fontsize=12,
                 y=1 - 12 / SIZE_PX[1], va="top")
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 3), frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, 8 / SIZE_PX[1]))
    save_png(fig, out_path)
    return out_path


def run_plot(run_dirs: list[str], out: str | None = None) -> str:
    """The `distrl plot` command: read every run (all must be readable; a sweep dir stands for its trials),
    draw; returns the PNG's path."""
    runs = [run for d in run_dirs for run in (read_sweep(d) if is_sweep(d) else [read_run(d)])]
    return draw_plot(runs, out or os.path.join(run_dirs[0], "plot.png"))
