"""Wall time to solve, per mode, over seeds, from the command's start (a fresh process).

    python -m bench.solve [--config configs/apex_dqn_cartpole.yaml] [--modes single sync async]
                          [--seeds 0 1 2] [--workers 2] [--max-seconds 300] [--against REV]

Each run is `distrl train ...` in its own process, so Python, torch and Ray
start-up are all inside the measured time. Mode, workers and budget default to
the config's own; results go to bench/results/solve_<config>.json, one file per
config, keeping the runs of modes not re-run.

`--against REV` runs every seed twice, alternately with this tree and with REV
(checked out as a git worktree under bench/out/, each side with its own copy of
the config), so that both are measured in one invocation under the same load;
results go to bench/results/solve_<config>_vs_<REV>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench.common import ROOT, hardware, write_json
from distrl.config import load_config


def solve_once(config: str, mode: str, seed: int, workers: int, max_seconds: float, extra: list[str],
               tree: str = ROOT, prefix: tuple[str, ...] = ()) -> dict:
    """One run of `config` (relative to `tree`) with the distrl of `tree`; `prefix`: a command to run it
    under (`flock LOCK`: waiting for the lock is before the run's clock starts)."""
    run_dir = tempfile.mkdtemp(prefix=f"solve-{mode}-{seed}-")
    os.rmdir(run_dir)
    cmd = [*prefix, sys.executable, "-m", "distrl.cli", "train", os.path.join(tree, config), "--mode", mode,
           "--seed", str(seed), "--workers", str(workers), "--max-seconds", str(max_seconds), "--run-dir", run_dir,
           "--set", "log.progress=false", *sum((["--set", e] for e in extra), [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env={**os.environ, "PYTHONPATH": tree})
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    curve = eval_curve(os.path.join(run_dir, "metrics.csv"))
    keys = ("mode", "workers", "seed", "solved", "time_to_solve_s", "wall_s", "env_steps", "updates",
            "best_eval_return", "policy_lag", "time_breakdown_s")
    out = {k: s.get(k) for k in keys}
    out["updates_per_s"] = round(s["updates"] / max(s["wall_s"], 1e-9), 1)
    out["eval_curve"] = curve
    return out


def eval_curve(metrics_csv: str) -> list[list[float]]:
    """[wall seconds, greedy mean return] of each evaluation of a run (a row whose evaluation columns changed)."""
    import csv

    out, last = [], None
    for row in csv.DictReader(open(metrics_csv)):
        key = (row["eval_return_mean"], row["eval_return_std"])
        if row["eval_return_mean"] and key != last:
            out.append([float(row["wall_s"]), float(row["eval_return_mean"])])
        last = key
    return out


def median_or_none(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(runs: list[dict], budget: float) -> dict:
    # An unsolved run counts as its full budget, so the median never flatters.
    times = [r["time_to_solve_s"] if r["solved"] else budget for r in runs]
    return {
        "time_to_solve_s": statistics.median(times), "solved": sum(r["solved"] for r in runs),
        "runs": len(runs), "budget_s": budget, "env_steps": median_or_none([r["env_steps"] for r in runs]),
        "updates": median_or_none([r["updates"] for r in runs]),
        "updates_per_s": median_or_none([r["updates_per_s"] for r in runs]),
        # An offline run (no workers) has no policy lag.
        "policy_lag_p50": median_or_none([(r["policy_lag"] or {}).get("p50") for r in runs]),
        "policy_lag_p90": median_or_none([(r["policy_lag"] or {}).get("p90") for r in runs]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml"))
    ap.add_argument("--modes", nargs="+", help="default: the config's own mode")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workers", type=int, help="default: the config's own")
    ap.add_argument("--max-seconds", type=float, help="default: the config's own stop.max_seconds")
    ap.add_argument("--set", dest="extra", action="append", default=[])
    ap.add_argument("--against", metavar="REV", help="also run every seed with the distrl of this git revision")
    ap.add_argument("--out", help="default: bench/results/solve_<config>.json (runs of other modes and seeds are kept)")
    args = ap.parse_args()
    cfg = load_config(args.config, args.extra)
    modes = args.modes or [cfg.mode]
    workers = args.workers or cfg.workers
    budget = args.max_seconds or cfg.stop.max_seconds
    config = os.path.relpath(os.path.abspath(args.config), ROOT)
    stem = os.path.splitext(os.path.basename(args.config))[0]
    trees = sides(args.against)
    if args.against:
        stem = f"{stem}_vs_{list(trees)[-1]}"
    out = args.out or os.path.join(ROOT, "bench", "results", f"solve_{stem}.json")
    old = json.load(open(out)) if os.path.exists(out) and not args.against else {}
    results = {"hardware": hardware(), "config": config, "overrides": args.extra,
               "runs": [r for r in old.get("runs", []) if r["mode"] not in modes or r["seed"] not in args.seeds],
               "median": {}}
    for mode in modes:
        for seed in args.seeds:
            for side, tree in trees.items():  # alternating: both sides see the same machine load
                r = solve_once(config, mode, seed, workers, budget, args.extra, tree)
                r["budget_s"], r["commit"] = budget, side
                results["runs"].append(r)
                print(json.dumps(r), flush=True)
    for key in dict.fromkeys(row_key(r, len(trees) > 1) for r in results["runs"]):
        runs = [r for r in results["runs"] if row_key(r, len(trees) > 1) == key]
        results["median"][key] = summarise(runs, runs[0].get("budget_s", budget))
    write_json(out, results)
    print(table(results))


def row_key(run: dict, by_commit: bool) -> str:
    return f"{run['commit']} {run['mode']}" if by_commit else run["mode"]


def worktree(rev: str) -> tuple[str, str]:
    """(short sha, a checkout of it under bench/out/) for running another revision's code."""
    sha = commit(ROOT, rev)
    path = os.path.join(ROOT, "bench", "out", f"tree-{sha}")
    if not os.path.isdir(path):
        subprocess.run(["git", "worktree", "add", "--detach", path, sha], cwd=ROOT, check=True, capture_output=True)
    return sha, path


def sides(against: str | None) -> dict[str, str]:
    """short sha -> source tree: this checkout, and `against`'s worktree when given."""
    out = {commit(ROOT): ROOT}
    if against:
        sha, tree = worktree(against)
        out[sha] = tree
    return out


def alternating(trees: dict[str, str], repeats: int, measure) -> dict[str, list[dict]]:
    """`measure(tree)` `repeats` times per side, the sides alternating so that both see the same machine load."""
    runs: dict[str, list[dict]] = {side: [] for side in trees}
    for _ in range(repeats):
        for side, tree in trees.items():
            runs[side].append(measure(tree))
            print(side, json.dumps(runs[side][-1]), flush=True)
    return runs


def commit(tree: str, rev: str = "HEAD") -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True, cwd=tree,
                          check=True).stdout.strip()


def table(results: dict) -> str:
    lines = ["| run | solved | budget (s) | median time to solve (s) | env steps | updates | updates/s | policy lag p50 / p90 |",
             "|---|---|---|---|---|---|---|---|"]
    for key, m in results["median"].items():
        lag = "-" if m["policy_lag_p50"] is None else f"{m['policy_lag_p50']:.0f} / {m['policy_lag_p90']:.0f}"
        lines.append(f"| {key} | {m['solved']}/{m['runs']} | {m['budget_s']:.0f} | {m['time_to_solve_s']:.1f} | {m['env_steps']:.0f} | "
                     f"{m['updates']:.0f} | {m['updates_per_s']:.0f} | {lag} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
