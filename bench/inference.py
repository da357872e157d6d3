"""Central against worker-local inference: sampling env steps/s with 1, 2 and 4 workers, and where the time goes.

    python -m bench.inference [--envs CartPole-v1 LunarLander-v3] [--workers 1 2 4] [--seconds 15]
    python -m bench.inference --config configs/apex_dqn_atari_breakout.yaml --workers 1 2   # the Nature CNN

Each run is Ape-X DQN (configs/apex_dqn_cartpole.yaml, env.id swapped; or `--config`, with its own env
unless `--envs` names others) in async mode with learning off (the replay never reaches its minimum size), so the workers and, for `rollout.inference=central`,
the InferenceServer have the cores to themselves. Per run: env steps/s; the workers' time split into
env stepping and inference (for central: the round trip to the server, waiting for the batch
included) per env step; and, from the run's trace, the server's busy share and the requests and rows
it ran per batch.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

from bench.common import ROOT, hardware, write_json
from bench.throughput import run

CONFIG = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")


def server_figures(run_dir: str) -> dict:
    """The inference server's busy share of the trace and its median requests and rows per batch."""
    from distrl.observe.report import build_report

    report = build_report(run_dir)
    server = next((p for p in report["processes"] if p["role"] == "inference"), None)
    if server is None:
        return {}
    with open(os.path.join(run_dir, "trace.json")) as fh:
        batches = [e["args"] for e in json.load(fh)["traceEvents"] if e.get("name") == "infer_batch"]
    return {"server_busy": round(server["busy"], 3),
            "requests_per_batch": statistics.median(b["requests"] for b in batches),
            "rows_per_batch": statistics.median(b["rows"] for b in batches)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--envs", nargs="+", default=None, help="default: CartPole-v1 LunarLander-v3, or --config's env")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "inference.json"))
    args = ap.parse_args()
    from distrl.config import load_config

    config = os.path.abspath(args.config)
    envs = args.envs or (["CartPole-v1", "LunarLander-v3"] if config == CONFIG else [load_config(config).env.id])
    results = {"command": "python -m bench.inference " + " ".join(sys.argv[1:]), "hardware": hardware(),
               "config": os.path.relpath(config, ROOT), "runs": []}
    for env in envs:
        for workers in args.workers:
            for where in ("local", "central"):
                run_dir = tempfile.mkdtemp(prefix=f"bench-inference-{where}-")
                extra = [f"env.id={env}", f"rollout.inference={where}", "log.trace=true"]
                r = run(config, "async", workers, args.seconds, learn=False, extra=extra, run_dir=run_dir)
                # A fraction is of the workers' summed wall time: per env step it is fraction x workers / rate.
                per_step = {f"{k[:-2]}_us_per_step": round(1e6 * r["fractions"][k] * workers / r["env_steps_per_s"], 1)
                            for k in ("env_s", "inference_s") if k in r["fractions"]}
                r.update(env=env, inference=where, **per_step, **server_figures(run_dir))
                shutil.rmtree(run_dir, ignore_errors=True)
                results["runs"].append(r)
                print(f"{env}, {workers} worker(s), {where}: {r['env_steps_per_s']:.0f} env steps/s; "
                      + ", ".join(f"{k} {v}" for k, v in r.items() if k.endswith("per_step") or k.endswith("batch")
                                  or k == "server_busy"), flush=True)
                write_json(args.out, results)


if __name__ == "__main__":
    main()
