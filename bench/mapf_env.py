"""Agent-steps per second of the MAPF gridworld on one core: random actions, resets included.

    python -m bench.mapf_env [--seconds 10]

One process, one thread, the default env settings (fov 9, 256-step limit, comm mask every
step) unless a case says otherwise. An agent-step is one agent acting for one env step; with
`remove_done_agents=False` (the default) every agent acts every step, so agent-steps/s is
N x env steps/s. Resets (map generation with the solvability check, BFS heuristics) happen
inside the timed loop whenever an episode ends; `reset ms` is their mean cost measured
separately. The target is >= 10k agent-steps/s for 8 agents on 20x20.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from bench.common import ROOT, hardware, write_json
from distrl.envs.mapf import MAPF
from distrl.threads import one_compute_thread

CASES = [
    ("8 agents, 20x20, density 0.3", dict(size=20, num_agents=8, density=0.3)),
    ("8 agents, 20x20, density 0.1", dict(size=20, num_agents=8, density=0.1)),
    ("4 agents, 10x10, density 0.3", dict(size=10, num_agents=4, density=0.3)),
]
TARGET = 10_000.0


def measure(kwargs: dict, seconds: float, seed: int = 0) -> dict:
    env = MAPF(**kwargs)
    n = env.num_agents
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < min(0.5, seconds / 4):  # warm-up: caches, allocator
        st = env.step(rng.integers(0, 5, n))
        if st.terminated or st.truncated:
            env.reset()
    steps = episodes = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(64):  # check the clock every 64 steps: time.perf_counter is not free
            st = env.step(rng.integers(0, 5, n))
            steps += 1
            if st.terminated or st.truncated:
                episodes += 1
                env.reset()
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(20):
        env.reset()
    reset_ms = (time.perf_counter() - t1) / 20 * 1e3
    return {"agents": n, "size": env.size, "density": env.density,
            "agent_steps_per_s": round(steps * n / elapsed, 1), "env_steps_per_s": round(steps / elapsed, 1),
            "step_us": round(elapsed / steps * 1e6, 1), "episodes": episodes, "reset_ms": round(reset_ms, 2),
            "seconds": round(elapsed, 2)}


def table(results: dict) -> str:
    lines = ["| case | agent-steps/s | env steps/s | us/step | episodes | reset ms |",
             "|---|---|---|---|---|---|"]
    for name, r in results["cases"].items():
        lines.append(f"| {name} | {r['agent_steps_per_s']:.0f} | {r['env_steps_per_s']:.0f} | {r['step_us']:.0f} "
                     f"| {r['episodes']} | {r['reset_ms']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="timed seconds per case")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "mapf_env.json"))
    args = ap.parse_args()
    one_compute_thread()
    results = {"hardware": hardware(), "seconds_per_case": args.seconds, "target_agent_steps_per_s": TARGET,
               "cases": {}}
    for name, kwargs in CASES:
        results["cases"][name] = measure(kwargs, args.seconds)
        print(f"{name}: {results['cases'][name]['agent_steps_per_s']:.0f} agent-steps/s", flush=True)
    rated = [r["agent_steps_per_s"] for r in results["cases"].values() if (r["agents"], r["size"]) == (8, 20)]
    results["target_met"] = min(rated) >= TARGET
    print(table(results))
    print(f"target (>= {TARGET:.0f} agent-steps/s, 8 agents on 20x20): {'met' if results['target_met'] else 'NOT met'}")
    write_json(args.out, results)


if __name__ == "__main__":
    main()
