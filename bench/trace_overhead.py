"""What recording a trace costs: env steps/s with `log.trace` on against off, interleaved in one invocation.

    python -m bench.trace_overhead [--seconds 25] [--repeats 5]

Each run is `distrl train` in its own process for a fixed wall time (evaluation target off), measured
in its steady state (the first seconds after the first fragment are left out); on and off alternate,
the order flipping every repeat, so a slow minute hits both. Overhead = 1 - median(on) / median(off).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from bench.common import ROOT, hardware, steady_rates, write_json

CASES = {"apex_dqn_cartpole async": ("apex_dqn_cartpole.yaml", "async"),
         "ppo_cartpole sync": ("ppo_cartpole.yaml", "sync")}


def one_run(config: str, mode: str, trace: bool, seconds: float) -> float:
    run_dir = tempfile.mkdtemp(prefix="trace-bench-")
    os.rmdir(run_dir)
    cmd = [sys.executable, "-m", "distrl.cli", "train", os.path.join(ROOT, "configs", config), "--mode", mode,
           "--max-seconds", str(seconds), "--run-dir", run_dir, "--set", f"log.trace={str(trace).lower()}",
           "--set", "eval.target_return=null", "--set", "log.progress=false", "--set", "log.tensorboard=false"]
    subprocess.run(cmd, check=True, capture_output=True)
    return steady_rates(run_dir, warmup_s=3.0)["env_steps_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    results = {"hardware": hardware(), "seconds": args.seconds, "cases": {}}
    for name, (config, mode) in CASES.items():
        rates = {False: [], True: []}
        for rep in range(args.repeats):
            for trace in ((False, True) if rep % 2 == 0 else (True, False)):
                rates[trace].append(one_run(config, mode, trace, args.seconds))
                print(name, "trace" if trace else "plain", round(rates[trace][-1]), flush=True)
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        results["cases"][name] = {"env_steps_per_s_off": rates[False], "env_steps_per_s_on": rates[True],
                                  "median_off": off, "median_on": on, "overhead": 1.0 - on / off}
    write_json(os.path.join(ROOT, "bench", "results", "trace_overhead.json"), results)
    print("| run | env steps/s, trace off (median) | trace on (median) | overhead |\n|---|---|---|---|")
    for name, c in results["cases"].items():
        print(f"| {name} | {c['median_off']:.0f} | {c['median_on']:.0f} | {100 * c['overhead']:.1f}% |")


if __name__ == "__main__":
    main()
