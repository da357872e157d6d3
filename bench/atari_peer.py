"""Training throughput on Atari Breakout, side by side with Sample Factory in one run.

    bash bench/peers/setup_sample_factory.sh            # once: Sample Factory's own venv
    python -m bench.atari_peer [--seconds 180]

The same algorithm, network and batch shape on both sides: PPO with the Nature CNN, 8 envs, rollouts of 128,
4 epochs x 4 minibatches of 256 per 1,024 agent steps (Sample Factory's sf_examples/atari defaults; distrl's
bench/configs/ppo_atari_breakout.yaml copies them), both on the CPU. In turn, each for `--seconds` of training:
Sample Factory's APPO runner on ALE/Breakout-v5 (frameskip 4 with max-pool, sticky actions 0.25), synchronous
(its Atari default) and with `--async_rl True`, 2 workers x 4 envs (bench/peers/sample_factory_atari.py); distrl
in single mode (one rollout of 8 envs) and in sync mode (2 Ray workers x 4 envs). Reported: agent steps per
second in the steady state (start-up excluded: Sample Factory's periodic frame counts, distrl's metrics rows),
one agent step being 4 emulator frames on both sides. JSON: bench/results/atari_peer.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from bench.common import ROOT, hardware, json_result, write_json
from bench.throughput import run

CONFIG = os.path.join(ROOT, "bench", "configs", "ppo_atari_breakout.yaml")
PEER_PYTHON = os.path.join(ROOT, "bench", "peers", ".venv-sf", "bin", "python")
PEER_SCRIPT = os.path.join(ROOT, "bench", "peers", "sample_factory_atari.py")


def sample_factory(seconds: float, extra: list[str]) -> dict:
    if not os.path.exists(PEER_PYTHON):
        raise SystemExit(f"{PEER_PYTHON} is missing: run `bash bench/peers/setup_sample_factory.sh` first")
    cmd = [PEER_PYTHON, PEER_SCRIPT, "--train_for_seconds", str(int(seconds)), "--env", "atari_breakout_v5", *extra]
    r = json_result(cmd, "Sample Factory")
    return {"side": "sample-factory", "mode": "async" if r["async_rl"] else "sync",
            "agent_steps_per_s": r["agent_steps_per_s_steady"], "agent_steps_per_s_with_start_up": r["agent_steps_per_s"],
            "raw": r}


def ours(mode: str, seconds: float) -> dict:
    # single: one rollout of 8 envs; sync: 2 workers of 4, Sample Factory's layout
    workers, extra = (1, []) if mode == "single" else (2, ["env.num_envs=4"])
    r = run(CONFIG, mode, workers, seconds, learn=True, extra=extra)
    return {"side": "distrl", "mode": mode, "agent_steps_per_s": r["env_steps_per_s"], "raw": r}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=180.0, help="training time of each run")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "atari_peer.json"))
    args = ap.parse_args()
    runs = []
    for step in (lambda: sample_factory(args.seconds, []), lambda: ours("single", args.seconds),
                 lambda: sample_factory(args.seconds, ["--async_rl", "True"]), lambda: ours("sync", args.seconds)):
        runs.append(step())
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "raw"}), flush=True)
    best = {side: max(r["agent_steps_per_s"] for r in runs if r["side"] == side) for side in ("distrl", "sample-factory")}
    results = {"command": "python -m bench.atari_peer " + " ".join(sys.argv[1:]), "hardware": hardware(),
               "config": os.path.relpath(CONFIG, ROOT), "seconds": args.seconds, "runs": runs,
               "best_agent_steps_per_s": best, "ratio_distrl_over_sample_factory": best["distrl"] / best["sample-factory"]}
    write_json(args.out, results)
    print("| side | mode | agent steps/s (steady) | frames/s |\n|---|---|---|---|")
    for r in runs:
        print(f"| {r['side']} | {r['mode']} | {r['agent_steps_per_s']:.0f} | {4 * r['agent_steps_per_s']:.0f} |")
    print(f"best distrl / best Sample Factory: {results['ratio_distrl_over_sample_factory']:.2f}")


if __name__ == "__main__":
    main()
