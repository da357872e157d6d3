"""Sampling throughput of each mode vs a bare gymnasium loop, and where the time goes.

    python -m bench.throughput [--config configs/apex_dqn_cartpole.yaml] [--seconds 15]
                               [--workers 1 2 4] [--modes single sync async]

Overhead ratio = env steps/s of a sampling-only run (learning off) / env steps/s
of a bare loop: the same number of processes each stepping `num_envs` envs with
random actions, no network, on the same cores (each env built as a worker's, with
the config's preset and wrappers, stepped one by one; a multi-agent env through
distrl's vector of them, all agents acting). `--bare-acting` adds a bare loop
whose actions come from the config's own acting policy (its network, untrained,
one thread), and the ratio against it: what distrl's sampling costs beyond the
envs and the network themselves. The training
runs then show where the time goes with the learner on. For multi-agent configs
agent-steps/s = env steps/s x agents.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time

import numpy as np

from bench.common import ROOT, hardware, steady_rates, write_json

CONFIG = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")


def _bare_multiagent(env_id: str, kwargs: dict, num_envs: int, seconds: float, seed: int) -> float:
    from distrl.roles.factory import make_vector_env

    envs = make_vector_env(env_id, num_envs, seed, kwargs, True)
    rng = np.random.default_rng(seed)
    shape, n = (num_envs, envs.num_agents), envs.action_space.n
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() < t0 + seconds:
        envs.step(rng.integers(0, n, shape))
        steps += num_envs
    return steps / (time.perf_counter() - t0)


def _bare_worker(env_id: str, kwargs: dict, wrappers: list | None, preset: str, multi_agent: bool, num_envs: int,
                 seconds: float, seed: int, acting: tuple | None, out) -> None:
    if multi_agent:
        out.put(_bare_multiagent(env_id, kwargs, num_envs, seconds, seed))
        return
    from distrl.envs import make_env

    envs = [make_env(env_id, kwargs, wrappers=wrappers, preset=preset) for _ in range(num_envs)]
    obs = [e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]
    rng = np.random.default_rng(seed)
    n = envs[0].action_space.n
    policy = None
    if acting is not None:  # (config path, overrides): act with the config's network, as a worker does
        from distrl.config import load_config
        from distrl.roles.factory import acting_policy, make_algorithm

        cfg = load_config(*acting)
        policy = acting_policy(cfg, 0, 1)
        policy.set_weights(make_algorithm(cfg).make_learner("cpu").get_weights(), 0)  # a learner's first weights
    steps, t_end = 0, time.perf_counter() + seconds
    t0 = time.perf_counter()
    while time.perf_counter() < t_end:
        actions = rng.integers(0, n, num_envs) if policy is None else policy.act(np.stack(obs), True)[0]
        for i, (e, a) in enumerate(zip(envs, actions)):
            obs[i], _, term, trunc, _ = e.step(a)
            if term or trunc:
                obs[i] = e.reset()[0]
        steps += num_envs
    out.put(steps / (time.perf_counter() - t0))


def bare_loop(processes: int, cfg, seconds: float, acting: tuple | None = None) -> float:
    """Env steps/s of `processes` processes each stepping the config's `num_envs` envs one by one: random
    actions, or (`acting`: the config's path and overrides) the actions of its acting policy (untrained)."""
    from distrl.registry import algorithm

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    args = (cfg.env.id, cfg.env.kwargs, cfg.env.wrappers, cfg.env.preset, algorithm(cfg.algo).multi_agent,
            cfg.env.num_envs, seconds)
    procs = [ctx.Process(target=_bare_worker, args=(*args, 100 * i, acting, q)) for i in range(processes)]
    for p in procs:
        p.start()
    rates = [q.get() for _ in procs]
    for p in procs:
        p.join()
    return float(sum(rates))


def _never_learn(config: str) -> list[str]:
    """Overrides that keep the learner from starting: a replay that never reaches its minimum size.
    Sequence replay preallocates its chunk store, so it keeps its capacity (runs are far shorter), as does a
    replay of 200k items or more (Atari frames: 2M would be ~15 GB). An on-policy algorithm has no replay
    (its config refuses a replay section): it always learns."""
    from distrl.config import load_config
    from distrl.registry import algorithm

    cfg = load_config(config)
    path = algorithm(cfg.algo).data_path
    if path not in ("replay", "sequence"):
        raise SystemExit(f"{config}: sampling-only runs need a replay algorithm ({cfg.algo} learns from "
                         f"{path} data); measure it with learning on")
    capacity = cfg.replay.capacity if path == "sequence" or cfg.replay.capacity >= 200_000 else 2_000_000
    return [f"replay.capacity={capacity}", f"replay.min_size={capacity}", "eval.interval_s=1000"]


def run(config: str, mode: str, workers: int, seconds: float, learn: bool, extra: list[str] = (),
        run_dir: str | None = None) -> dict:
    from distrl import train

    overrides = [f"mode={mode}", f"workers={workers}", "eval.target_return=null", "log.progress=false",
                 "log.tensorboard=false", "log.interval_s=0.5", *extra]
    if not learn:  # sampling only: learning never starts, so no learner competes for the cores
        overrides += _never_learn(config)
    run_dir = run_dir or tempfile.mkdtemp(prefix=f"bench-{mode}-{workers}-")
    start = time.time()
    # stop.max_seconds counts from start-up: give start-up its own allowance.
    summary = train(config, overrides=overrides + [f"stop.max_seconds={seconds + 30}"], run_dir=run_dir,
                    start_time=start)
    rates = steady_rates(run_dir)
    wall = summary["wall_s"]
    tb = summary["time_breakdown_s"]
    n = workers if mode != "single" else 1
    worker_time = n * wall
    breakdown = {k: round(v / worker_time, 3) for k, v in tb.items()
                 if k in ("env_s", "inference_s", "pull_s", "worker_idle_s")}
    breakdown.update({k: round(v / wall, 3) for k, v in tb.items() if k.startswith("learner")})
    return {"mode": mode, "workers": n, "learn": learn, **{k: round(v, 1) for k, v in rates.items()},
            "fractions": breakdown}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--modes", nargs="+", default=["single", "sync", "async"])
    ap.add_argument("--set", dest="extra", action="append", default=[], help="config override, e.g. rollout.fragment_length=64")
    ap.add_argument("--learn", choices=["both", "off", "on"], default="both", help="sampling-only runs, training runs, or both")
    ap.add_argument("--bare-acting", action="store_true",
                    help="also a bare loop that acts with the config's network: the ratio without the network's cost")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "throughput.json"))
    args = ap.parse_args()
    from distrl.config import load_config

    cfg = load_config(args.config, args.extra)
    num_envs = cfg.env.num_envs
    results = {"command": "python -m bench.throughput " + " ".join(sys.argv[1:]), "hardware": hardware(),
               "config": os.path.relpath(args.config, ROOT), "num_envs": num_envs, "overrides": args.extra,
               "bare": {}, "runs": []}
    for w in sorted(set(args.workers) | {1}):
        results["bare"][w] = round(bare_loop(w, cfg, 5.0), 1)
        print(f"bare loop, {w} process(es) x {num_envs} envs: {results['bare'][w]:.0f} steps/s", flush=True)
        if args.bare_acting:
            results.setdefault("bare_acting", {})[w] = round(bare_loop(w, cfg, 10.0, (args.config, args.extra)), 1)
            print(f"bare loop acting with the network: {results['bare_acting'][w]:.0f} steps/s", flush=True)
    for mode in args.modes:
        for w in ([1] if mode == "single" else args.workers):
            for learn in {"both": (False, True), "off": (False,), "on": (True,)}[args.learn]:
                r = run(args.config, mode, w, args.seconds, learn, args.extra)
                if not learn:
                    r["overhead_ratio"] = round(r["env_steps_per_s"] / results["bare"][w], 3)
                    if args.bare_acting:
                        r["overhead_ratio_acting"] = round(r["env_steps_per_s"] / results["bare_acting"][w], 3)
                results["runs"].append(r)
                print(r, flush=True)
    write_json(args.out, results)
    print(table(results))


def table(results: dict) -> str:
    """Markdown; the overhead ratio is "random / acting" where the acting bare loop was measured."""
    lines = ["| mode | workers | learner | env steps/s | updates/s | overhead ratio | env | inference | weights pull | worker idle | learner busy | learner waits |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        f = r["fractions"]
        lines.append(f"| {r['mode']} | {r['workers']} | {'on' if r['learn'] else 'off'} | {r['env_steps_per_s']:.0f} | "
                     f"{r['updates_per_s']:.0f} | {r.get('overhead_ratio', '')}"
                     f"{' / %s' % r['overhead_ratio_acting'] if 'overhead_ratio_acting' in r else ''} | {f.get('env_s', 0):.0%} | "
                     f"{f.get('inference_s', 0):.0%} | {f.get('pull_s', 0):.0%} | {f.get('worker_idle_s', 0):.0%} | "
                     f"{f.get('learner_s', 0):.0%} | {f.get('learner_wait_s', 0):.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
