"""Learning from simulators that own their loop: PPO and Ape-X DQN on CartPole driven by 2 and 4 client
processes (`bench.external_sim`, each its own gymnasium env), remote and local inference.

    python -m bench.external_learning [--algos ppo apex_dqn] [--clients 2 4] [--inference remote local] [--seeds 0]

Each run is the shipped config (`configs/<algo>_cartpole.yaml`: its mode, budget and 475 greedy target) with
`external.enabled=true`; the time to solve is the run's own (from the command's start, Python and Ray
start-up included).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench.common import ROOT, hardware, measured_commit, write_json
from bench.external import simulators


def run(algo: str, clients: int, inference: str, seed: int) -> dict:
    run_dir = tempfile.mkdtemp(prefix="bench-external-learning-")
    os.rmdir(run_dir)
    config = os.path.join(ROOT, "configs", f"{algo}_cartpole.yaml")
    cmd = [sys.executable, "-m", "distrl.cli", "train", config, "--run-dir", run_dir, "--seed", str(seed),
           "--set=external.enabled=true", "--set=log.progress=false"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sims = simulators(run_dir, proc, clients, inference, ("--weights-interval", "1"))
    try:
        proc.communicate(timeout=1200)
    finally:
        for p in sims:
            p.kill()
            p.wait()
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    return {"algo": algo, "clients": clients, "inference": inference, "seed": seed, "mode": s["mode"],
            "solved": s["solved"], "time_to_solve_s": s["time_to_solve_s"], "env_steps": s["env_steps"],
            "best_eval_return": s["best_eval_return"], "wall_s": s["wall_s"], "policy_lag_mean":
            (s["policy_lag"] or {}).get("mean"), "external": s["external"]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--algos", nargs="+", default=["ppo", "apex_dqn"])
    p.add_argument("--clients", type=int, nargs="+", default=[2, 4])
    p.add_argument("--inference", nargs="+", default=["remote", "local"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "external_learning.json"))
    a = p.parse_args(argv)
    rows = []
    for algo in a.algos:
        for n in a.clients:
            for inference in a.inference:
                for seed in a.seeds:
                    rows.append(run(algo, n, inference, seed))
                    print(json.dumps(rows[-1]), flush=True)
    write_json(a.out, {"rows": rows, "hardware": hardware(), "commit": measured_commit()})


if __name__ == "__main__":
    main()
