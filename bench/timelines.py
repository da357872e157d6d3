"""The docs' timelines (the README and docs/concepts/modes.md show them): one traced Ape-X DQN CartPole run per mode, drawn by `distrl timeline`.

    python -m bench.timelines [--seconds 20] [--window 0.6]

Writes docs/timeline_single.png, docs/timeline_sync.png and docs/timeline_async.png, each a
`--window`-second slice starting halfway through the run's trace.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench.common import ROOT


def traced_run(mode: str, seconds: float) -> str:
    run_dir = os.path.join(tempfile.mkdtemp(), f"apex_dqn_cartpole_{mode}")  # the PNG's title names the run
    subprocess.run([sys.executable, "-m", "distrl.cli", "train", os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml"),
                    "--mode", mode, "--max-seconds", str(seconds), "--run-dir", run_dir, "--set", "log.trace=true",
                    "--set", "eval.target_return=null", "--set", "eval.interval_s=2", "--set", "log.progress=false"],
                   check=True, capture_output=True)
    return run_dir


def middle(run_dir: str) -> float:
    events = json.load(open(os.path.join(run_dir, "trace.json")))["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    lo, hi = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
    return (lo + hi) / 2e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--window", type=float, default=0.6)
    args = ap.parse_args()
    os.makedirs(os.path.join(ROOT, "docs"), exist_ok=True)
    for mode in ("single", "sync", "async"):
        run_dir = traced_run(mode, args.seconds)
        start = middle(run_dir)
        out = os.path.join(ROOT, "docs", f"timeline_{mode}.png")
        subprocess.run([sys.executable, "-m", "distrl.cli", "timeline", run_dir, "--from", f"{start:.3f}",
                        "--to", f"{start + args.window:.3f}", "-o", out], check=True)
        print(out)


if __name__ == "__main__":
    main()
