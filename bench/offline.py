"""Offline RL on datasets distrl records itself, against d3rlpy on the same datasets and criterion.

    python -m bench.offline [--seeds 0 1 2] [--budget-s 300] [--no-peer]

Per seed: a PPO CartPole run (single mode, until a perfect evaluation) logs its whole experience (the mixed dataset, log.dataset),
`distrl record` plays its best checkpoint for 50 greedy episodes (the expert dataset); a SAC Pendulum
run's first 8,000 steps are logged (the continuous dataset). Then, each a fresh process timed from its
start: distrl BC on the expert data, BC and CQL on the mixed data, continuous CQL on the Pendulum data;
and d3rlpy's DiscreteBC / DiscreteCQL / CQL on the same datasets (bench/peers/d3rlpy_offline.py in
its own venv: `bash bench/peers/setup_d3rlpy.sh`), with the same network sizes and rates. Criterion: a
greedy mean over 20 episodes reaching CartPole's 475 or Pendulum's -300. JSON: bench/results/offline.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench.common import ROOT, hardware, json_result, write_json

PEER_PYTHON = os.path.join(ROOT, "bench", "peers", ".venv-d3rlpy", "bin", "python")
CASES = [  # (name, our config, dataset kind, d3rlpy algo, env, target)
    ("BC, expert CartPole", "bc_cartpole", "expert", "bc", "CartPole-v1", 475.0),
    ("BC, mixed CartPole", "bc_cartpole", "mixed", "bc", "CartPole-v1", 475.0),
    ("CQL, mixed CartPole", "cql_cartpole", "mixed", "cql", "CartPole-v1", 475.0),
    ("CQL, SAC's Pendulum", "cql_pendulum", "pendulum", "cql", "Pendulum-v1", -300.0),
]


def distrl(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "distrl.cli", *args], check=True, cwd=ROOT, capture_output=True, text=True)


def record_datasets(root: str, seed: int) -> dict[str, str]:
    """The three datasets of one seed, recorded by distrl."""
    out = {k: os.path.join(root, f"{k}-s{seed}-v0") for k in ("mixed", "expert", "pendulum")}
    quiet = ["--set", "log.progress=false", "--set", "log.tensorboard=false"]
    distrl("train", "configs/ppo_cartpole.yaml", "--seed", str(seed), "--run-dir", os.path.join(root, f"ppo{seed}"),
           "--set", f"log.dataset={out['mixed']}", *quiet,
           # evaluated at fixed steps until a perfect score: the expert is a policy that scores 500
           "--set", "eval.interval_steps=4096", "--set", "eval.target_return=500")
    distrl("record", os.path.join(root, f"ppo{seed}"), "--episodes", "50", "-o", out["expert"], "--seed", str(seed))
    distrl("train", "configs/sac_pendulum.yaml", "--seed", str(seed), "--run-dir", os.path.join(root, f"sac{seed}"),
           "--set", f"log.dataset={out['pendulum']}", "--set", "eval.target_return=null",
           "--set", "stop.max_env_steps=8000", *quiet)
    return out


def ours(config: str, dataset: str, seed: int, budget_s: float, root: str) -> dict:
    run_dir = tempfile.mkdtemp(prefix="offline-", dir=root)
    os.rmdir(run_dir)
    distrl("train", f"configs/{config}.yaml", "--seed", str(seed), "--run-dir", run_dir, "--max-seconds", str(budget_s),
           "--set", f"data.dataset={dataset}", "--set", "stop.max_updates=null", "--set", "log.progress=false")
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    return {k: s[k] for k in ("solved", "time_to_solve_s", "best_eval_return", "updates", "wall_s")}


def peer(algo: str, dataset: str, env: str, target: float, seed: int, budget_s: float) -> dict:
    return json_result([PEER_PYTHON, os.path.join(ROOT, "bench", "peers", "d3rlpy_offline.py"), algo, dataset, env,
                        str(target), str(seed), str(budget_s)], "d3rlpy")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-offline-")
    runs = []
    for seed in args.seeds:
        data = record_datasets(root, seed)
        for name, config, kind, algo, env, target in CASES:
            r = {"case": name, "seed": seed, "side": "distrl", **ours(config, data[kind], seed, args.budget_s, root)}
            runs.append(r)
            print(json.dumps(r), flush=True)
            if not args.no_peer:
                r = {"case": name, "seed": seed, "side": "d3rlpy", **peer(algo, data[kind], env, target, seed, args.budget_s)}
                runs.append(r)
                print(json.dumps(r), flush=True)
    results = {"hardware": hardware(), "budget_s": args.budget_s, "runs": runs, "median": summarise(runs, args.budget_s)}
    write_json(os.path.join(ROOT, "bench", "results", "offline.json"), results)
    print(table(results))


def summarise(runs: list[dict], budget: float) -> dict:
    out = {}
    for key in dict.fromkeys((r["case"], r["side"]) for r in runs):
        rs = [r for r in runs if (r["case"], r["side"]) == key]
        out[" / ".join(key)] = {
            "solved": sum(r["solved"] for r in rs), "runs": len(rs),
            "time_to_solve_s": statistics.median(r["time_to_solve_s"] if r["solved"] else budget for r in rs),
            "best_eval_return": statistics.median(r["best_eval_return"] for r in rs),
            "per_seed_best": [round(r["best_eval_return"], 1) for r in rs]}
    return out


def table(results: dict) -> str:
    lines = ["| case / side | solved | median time to solve (s) | median best return | best return per seed |",
             "|---|---|---|---|---|"]
    for key, m in results["median"].items():
        lines.append(f"| {key} | {m['solved']}/{m['runs']} | {m['time_to_solve_s']:.1f} | {m['best_eval_return']:.1f} | "
                     f"{' / '.join(str(x) for x in m['per_seed_best'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
