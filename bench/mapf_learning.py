"""DHC's greedy success rate against wall time on the MAPF gridworld, communication on and off.

    python -m bench.mapf_learning [--configs configs/dhc_mapf_10x10.yaml ...] [--seeds 0 1 2]
                                  [--max-seconds 900] [--keep DIR] [--set KEY=VALUE ...]

8 agents on 20x20 (density 0.3): --configs bench/configs/dhc_mapf_20x20.yaml

Each run is `distrl train CONFIG --seed S [--set dhc.comm=false]` in its own process (start-up
inside the time), stopped at the config's `eval.target_success` or at `--max-seconds`. From each
run's metrics.csv: the success rate of every evaluation against wall time and env steps, the time
and env steps at which it first reached the target, and the best success rate. With `--keep DIR`
the run dirs stay, for `distrl plot` or `distrl report`. Target on 2 cores: 4 agents on 10x10 at
>= 0.9 success within 15 minutes.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import tempfile

from bench.common import ROOT, checked_run, hardware, write_json
from distrl.config import load_config

CONFIGS = [os.path.join(ROOT, "configs", "dhc_mapf_10x10.yaml")]


def success_curve(run_dir: str) -> list[tuple[float, int, float]]:
    """(wall s, env steps, success rate) of every evaluation in the run's metrics.csv."""
    out = []
    for row in csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))):
        value = float(row.get("eval_success_rate") or "nan")
        if math.isfinite(value):
            out.append((float(row["wall_s"]), int(row["env_steps"]), value))
    return out


def run_once(config: str, seed: int, comm: bool, max_seconds: float, keep: str | None, extra: list[str]) -> dict:
    name = f"{os.path.basename(config)[:-5]}-{'comm' if comm else 'nocomm'}-{seed}"
    parent = keep or tempfile.mkdtemp(prefix="mapf-")
    run_dir = os.path.join(parent, name)
    cmd = [sys.executable, "-m", "distrl.cli", "train", config, "--seed", str(seed), "--max-seconds",
           str(max_seconds), "--run-dir", run_dir, "--set", "log.progress=false", "--set", f"dhc.comm={str(comm).lower()}",
           *sum((["--set", e] for e in extra), [])]
    checked_run(cmd, "run")
    target = load_config(config, extra).eval.target_success
    curve = success_curve(run_dir)
    reached = next(((t, s) for t, s, v in curve if v >= target), (None, None))
    return {"config": os.path.relpath(config, ROOT), "overrides": extra, "seed": seed, "comm": comm, "target_success": target,
            "time_to_target_s": reached[0], "env_steps_to_target": reached[1],
            "best_success": max((v for _, _, v in curve), default=None), "curve": curve}


def summarise(runs: list[dict]) -> list[dict]:
    rows = []
    for config in dict.fromkeys(r["config"] for r in runs):
        for comm in (True, False):
            group = [r for r in runs if r["config"] == config and r["comm"] == comm]
            if not group:
                continue
            times = [r["time_to_target_s"] for r in group if r["time_to_target_s"] is not None]
            rows.append({"config": config, "comm": comm, "runs": len(group), "reached": len(times),
                         "median_time_to_target_s": statistics.median(times) if len(times) == len(group) else None,
                         "median_best_success": statistics.median(r["best_success"] or 0.0 for r in group)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", nargs="+", default=CONFIGS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--comm", choices=["both", "on", "off"], default="both")
    ap.add_argument("--max-seconds", type=float, default=900.0)
    ap.add_argument("--keep", help="a directory to keep the run dirs in")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="config override for every run")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "mapf_learning.json"))
    args = ap.parse_args()
    comms = {"both": [True, False], "on": [True], "off": [False]}[args.comm]
    runs = []
    for config in args.configs:
        for seed in args.seeds:
            for comm in comms:  # interleaved, so a slow hour hits both arms alike
                run = run_once(config, seed, comm, args.max_seconds, args.keep, args.extra)
                runs.append(run)
                print(f"{run['config']} seed {seed} comm {comm}: target at {run['time_to_target_s']} s, "
                      f"best {run['best_success']}", flush=True)
                # Written after every run: a long invocation stopped early keeps what it measured.
                write_json(args.out, {"command": "python -m bench.mapf_learning " + " ".join(sys.argv[1:]),
                                      "hardware": hardware(), "summary": summarise(runs), "runs": runs})


if __name__ == "__main__":
    main()
