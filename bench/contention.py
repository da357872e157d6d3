"""A distributed run beside busy processes: how soon it starts, how far it gets, how soon it ends.

    python -m bench.contention [--busy 2] [--seconds 60] [--against REV] [--repeats 1]

`--busy` processes spin on the CPU at the default priority (a simulator, a second run, the other half of
a test suite) while `distrl train` runs Ape-X DQN on CartPole in async mode with every role kind (two
rollout workers, central inference, two gradient workers) for `--seconds`. Its env waits 3 ms a step
on the clock, as a simulator does. Read from the run's files: when its first metrics row came (the roles
had started), its env steps and updates, and `stop_to_summary_s` (the wind-down). `--against REV` runs
the same with the distrl of that git revision (a worktree under bench/out/), repeats alternating.
JSON: bench/results/contention.json.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

from bench.common import ROOT, hardware, write_json
from bench.solve import alternating, sides

RUN = ["mode=async", "workers=2", "learner.num_gradient_workers=2", "rollout.inference=central",
       "log.progress=false", "log.tensorboard=false", "log.interval_s=1", "eval.target_return=null",
       "env.id=distrl.envs.testing:WaitingCartPole-v1", "env.kwargs={step_s: 0.003}"]
SPIN = "while True: sum(range(10000))"


def measure(tree: str, busy: int, seconds: float) -> dict:
    run_dir = os.path.join(tempfile.mkdtemp(prefix="contention-"), "run")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        sets = [x for s in [*RUN, f"stop.max_seconds={seconds:g}"] for x in ("--set", s)]
        subprocess.run([sys.executable, "-m", "distrl.cli", "train", os.path.join(tree, "configs", "apex_dqn_cartpole.yaml"),
                        "--run-dir", run_dir, *sets], cwd=tree, env={**os.environ, "PYTHONPATH": tree},
                       capture_output=True, text=True, timeout=seconds + 600)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    stepping = [float(r["wall_s"]) for r in rows if int(r["env_steps"]) > 0]
    return {"first_steps_at_s": stepping[0] if stepping else None, "env_steps": summary["env_steps"],
            "updates": summary["updates"], "stop_to_summary_s": summary["stop_to_summary_s"],
            "skipped_at_stop": sorted(summary["skipped_at_stop"])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy", type=int, default=2, help="processes spinning beside the run")
    ap.add_argument("--seconds", type=float, default=60.0, help="the run's budget")
    ap.add_argument("--against", metavar="REV")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    runs = alternating(sides(args.against), args.repeats, lambda tree: measure(tree, args.busy, args.seconds))
    write_json(os.path.join(ROOT, "bench", "results", "contention.json"),
               {"hardware": hardware(), "busy": args.busy, "seconds": args.seconds, "overrides": RUN, "runs": runs})


if __name__ == "__main__":
    main()
