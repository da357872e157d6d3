"""Stable-Baselines3 against distrl, same criterion, same clock: the harness the SB3 peers share.

A peer module (`bench.peers.sb3_minatar`, `bench.peers.sb3_cartpole`) names a distrl config and builds
its SB3 model; this module runs both sides seed by seed, alternating, each a fresh process timed from its
own start (Python, torch and the library's imports included, as distrl's time to solve is), and
summarises them. SB3's evaluation follows the config's: every `eval.interval_s` of wall time,
`eval.episodes` greedy episodes (one env each, seeded seed + 10_000 + episodes * evaluation + episode
as distrl's evaluator seeds them); solved at the first mean return >= `eval.target_return`, unsolved
after the budget. distrl evaluates in a thread or process of its own beside training; SB3's evaluation
runs inside its training loop, so the interval is counted from the end of the previous evaluation,
leaving SB3 an interval of training between two. SB3 runs on one torch thread.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

EVAL_SEED_OFFSET = 10_000  # distrl.roles.evaluation's: evaluation i plays seeds seed + offset + i * episodes + j


def child_args(extra: dict[str, dict] | None = None) -> argparse.Namespace:
    """The child's arguments: `--child SEED BUDGET_S`, the criterion, and a peer's own `extra` options."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2, metavar=("SEED", "BUDGET_S"), required=True)
    ap.add_argument("--interval-s", type=float, required=True)
    ap.add_argument("--episodes", type=int, required=True)
    ap.add_argument("--target", type=float, required=True)
    ap.add_argument("--max-episode-steps", type=int)
    for name, kwargs in (extra or {}).items():
        ap.add_argument(name, **kwargs)
    args = ap.parse_args()
    args.seed, args.budget_s = int(args.child[0]), float(args.child[1])
    return args


def stack(observations: list):
    """One batch of observations: arrays stacked; a Dict observation's keys stacked each."""
    import numpy as np

    if isinstance(observations[0], dict):
        return {k: np.stack([o[k] for o in observations]) for k in observations[0]}
    return np.stack(observations)


def evaluate(model, envs, seed: int, normalize_obs=None, action_masks=None) -> float:
    """Mean return of one greedy episode per env, env i seeded seed + i; `normalize_obs`: what the policy
    sees of an observation (VecNormalize's frozen statistics; None: the observation itself);
    `action_masks(env)`: an env's legal actions now, passed to `predict` (MaskablePPO; None: no mask)."""
    import numpy as np

    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    returns, running = np.zeros(len(envs)), np.ones(len(envs), bool)
    while running.any():
        rows = np.flatnonzero(running)
        seen = stack([obs[i] for i in rows])
        seen = seen if normalize_obs is None else normalize_obs(seen)
        masks = {} if action_masks is None else {"action_masks": np.stack([action_masks(envs[i]) for i in rows])}
        actions, _ = model.predict(seen, deterministic=True, **masks)
        for i, a in zip(rows, actions):
            obs[i], reward, term, trunc, _ = envs[i].step(a)
            returns[i] += reward
            running[i] = not (term or trunc)
    return float(returns.mean())


def run_child(model, make_env, args, start: float, total_timesteps: int, first_eval_after: int = 0,
              normalize_obs=None, action_masks=None) -> None:
    """Train `model` until the criterion is met or the budget spent; print one JSON line of the run.

    `start` is the child's clock, read before its imports; no evaluation before `first_eval_after` env
    steps (an off-policy learner's first update: distrl's first evaluation also waits for one);
    `normalize_obs`, `action_masks`: `evaluate`'s."""
    import numpy as np
    import stable_baselines3
    from stable_baselines3.common.callbacks import BaseCallback

    class Solve(BaseCallback):
        def __init__(self):
            super().__init__()
            self.envs = [make_env() for _ in range(args.episodes)]
            self.evaluations, self.last_eval, self.best, self.solved_at = 0, start, -np.inf, None
            self.curve = []  # [seconds since the start, mean return] of each evaluation

        def _on_step(self) -> bool:
            if time.time() - start >= args.budget_s:
                return False
            if self.model.num_timesteps <= first_eval_after or time.time() - self.last_eval < args.interval_s:
                return True
            seed = args.seed + EVAL_SEED_OFFSET + self.evaluations * args.episodes
            mean = evaluate(self.model, self.envs, seed, normalize_obs, action_masks)
            self.evaluations += 1
            self.last_eval = time.time()
            self.curve.append([self.last_eval - start, mean])
            self.best = max(self.best, mean)
            if mean >= args.target:
                self.solved_at = self.last_eval - start
                return False
            return True

    solve = Solve()
    model.learn(total_timesteps=total_timesteps, callback=solve)
    print(json.dumps({"solved": solve.solved_at is not None, "time_to_solve_s": solve.solved_at,
                      "best_eval_return": solve.best if solve.evaluations else None, "env_steps": int(model.num_timesteps),
                      "wall_s": time.time() - start, "evaluations": solve.evaluations,
                      "sb3": stable_baselines3.__version__, "eval_curve": solve.curve}))


def sb3_once(module: str, seed: int, budget: float, cfg, extra: list[str], prefix: tuple[str, ...] = ()) -> dict:
    """One SB3 run of peer `module` in a fresh process, with the evaluation of distrl's config `cfg`
    (`prefix`: solve_once's)."""
    from bench.common import json_result

    cmd = [*prefix, sys.executable, "-m", module, "--child", str(seed), str(budget), "--interval-s", str(cfg.eval.interval_s),
           "--episodes", str(cfg.eval.episodes), "--target", str(cfg.eval.target_return), *extra]
    return json_result(cmd, "SB3 run")  # run from the repository's root, where `-m bench.peers...` resolves


def summarise(runs: list[dict], budget: float) -> dict:
    out = {}
    for side in dict.fromkeys(r["side"] for r in runs):
        rs = [r for r in runs if r["side"] == side]
        solved = sum(r["solved"] for r in rs)
        out[side] = {
            "solved": solved, "runs": len(rs), "per_seed_time_to_solve_s": [r["time_to_solve_s"] for r in rs],
            "median_time_to_solve_s": statistics.median(r["time_to_solve_s"] for r in rs) if solved == len(rs) else None,
            # an unsolved seed counted as the whole budget: never flatters the side
            "median_unsolved_as_budget_s": statistics.median(r["time_to_solve_s"] if r["solved"] else budget for r in rs),
            "per_seed_best_return": [r["best_eval_return"] for r in rs],
            "median_env_steps": statistics.median(r["env_steps"] for r in rs)}
    if {"sb3", "distrl"} <= out.keys():
        sb3, ours = out["sb3"], out["distrl"]
        exact = sb3["median_time_to_solve_s"] is not None and ours["median_time_to_solve_s"] is not None
        out["ratio_sb3_over_distrl"] = sb3["median_time_to_solve_s"] / ours["median_time_to_solve_s"] if exact else None
        if not exact:
            # the budget understates an unsolved side's time: a lower bound if only SB3 left seeds unsolved
            out["ratio_unsolved_as_budget"] = sb3["median_unsolved_as_budget_s"] / ours["median_unsolved_as_budget_s"]
            out["ratio_unsolved_as_budget_is"] = ("lower bound" if ours["solved"] == ours["runs"] else
                                                  "upper bound" if sb3["solved"] == sb3["runs"] else "no bound")
    return out


def table(summary: dict) -> str:
    def s(x):
        return "-" if x is None else f"{x:.1f}"

    lines = ["| side | solved | time to solve per seed (s) | median (s) | median, unsolved = budget (s) | best return per seed | median env steps |",
             "|---|---|---|---|---|---|---|"]
    for side in ("distrl", "sb3"):
        if side in summary:
            m = summary[side]
            lines.append(f"| {side} | {m['solved']}/{m['runs']} | {' / '.join(s(t) for t in m['per_seed_time_to_solve_s'])} | "
                         f"{s(m['median_time_to_solve_s'])} | {s(m['median_unsolved_as_budget_s'])} | "
                         f"{' / '.join(s(b) for b in m['per_seed_best_return'])} | {m['median_env_steps']:.0f} |")
    if summary.get("ratio_sb3_over_distrl") is not None:
        lines.append(f"\nmedian(SB3) / median(distrl): {summary['ratio_sb3_over_distrl']:.2f}")
    elif "ratio_unsolved_as_budget" in summary:
        lines.append(f"\nmedian(SB3) / median(distrl), unsolved seeds counted as the budget: "
                     f"{summary['ratio_unsolved_as_budget']:.2f} ({summary['ratio_unsolved_as_budget_is']})")
    return "\n".join(lines)


def compare(module: str, config: str, argv_extra: dict[str, dict], child_extra, record: dict, out_name: str,
            ours_overrides=lambda args: []) -> None:
    """The driver: distrl's `config` and SB3's peer `module`, seed by seed; JSON and a table.

    `argv_extra` adds the peer's own options; `child_extra(args, cfg)` turns them into the child's
    arguments; `record(args)` is what the JSON says of SB3's settings; `ours_overrides(args)`: `--set`s
    of distrl's side (a same-settings row where SB3 lacks a part of distrl's config)."""
    from bench.common import ROOT, hardware, write_json
    from bench.solve import solve_once
    from distrl.config import load_config
    from distrl.roles.evaluation import EVAL_SEED_OFFSET as distrl_offset

    assert EVAL_SEED_OFFSET == distrl_offset, "the child must seed its evaluations as distrl's evaluator does"
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget-s", type=float, help="default: the config's stop.max_seconds")
    ap.add_argument("--no-ours", action="store_true", help="SB3 only")
    ap.add_argument("--no-sb3", action="store_true", help="distrl only")
    ap.add_argument("--ours-from", metavar="JSON", help="distrl's runs of these seeds copied from another result "
                    "of the same config (another SB3 row against the same distrl runs), not re-run")
    ap.add_argument("--lock", help="run each run under `flock LOCK` (a machine shared with other heavy jobs)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", out_name))
    for name, kwargs in argv_extra.items():
        ap.add_argument(name, **kwargs)
    args = ap.parse_args()
    cfg = load_config(os.path.join(ROOT, config))
    budget = args.budget_s or cfg.stop.max_seconds
    prefix = ("flock", args.lock) if args.lock else ()
    sides = [s for s, skip in (("distrl", args.no_ours or args.ours_from), ("sb3", args.no_sb3)) if not skip]
    # The file keeps the runs of sides and seeds not re-run, and is written after every run.
    old = json.load(open(args.out))["runs"] if os.path.exists(args.out) else []
    runs = [r for r in old if not (r["side"] in sides and r["seed"] in args.seeds)]
    if args.ours_from:
        src = json.load(open(args.ours_from))
        assert src["config"] == config, f"{args.ours_from} is a result of {src['config']}, not {config}"
        runs = [r for r in runs if not (r["side"] == "distrl" and r["seed"] in args.seeds)]
        runs += [{**r, "copied_from": os.path.relpath(args.ours_from, ROOT)} for r in src["runs"]
                 if r["side"] == "distrl" and r["seed"] in args.seeds]

    commit, cpu = hardware()["commit"], hardware()["cpu"]
    overrides = ours_overrides(args)

    def save():
        if runs:  # per run: a file's seeds may come from several sessions' machines
            runs[-1].setdefault("commit", commit)
            runs[-1].setdefault("cpu", cpu)
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "eval_curve"}), flush=True)
        results = {"hardware": hardware(), "config": config, "env": cfg.env.id, "budget_s": budget,
                   "target_return": cfg.eval.target_return, "sb3_settings": {**record(args), "torch_threads": 1},
                   "distrl_overrides": overrides,
                   "runs": runs, "summary": summarise(runs, budget)}
        write_json(args.out, results)
        return results

    for seed in args.seeds:
        if "distrl" in sides:  # alternating: both sides see the same machine load
            r = solve_once(config, cfg.mode, seed, cfg.workers, budget, ["log.tensorboard=false", *overrides],
                           prefix=prefix)
            r = {"side": "distrl", "seed": seed, **{k: r[k] for k in ("solved", "time_to_solve_s", "best_eval_return",
                                                                      "env_steps", "wall_s", "mode", "workers",
                                                                      "eval_curve")}}
            runs.append(r)
            save()
        if "sb3" in sides:
            r = {"side": "sb3", "seed": seed, **sb3_once(module, seed, budget, cfg, child_extra(args, cfg), prefix)}
            runs.append(r)
            save()
    results = save()
    print(table(results["summary"]))
    plot_curves(results, os.path.splitext(args.out)[0] + ".png")


def plot_curves(results: dict, path: str) -> None:
    """Greedy mean return against seconds since the command's start, every run of both sides, the target
    as a line: one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    colours = {"distrl": "tab:blue", "sb3": "tab:orange"}
    for side in colours:
        for i, r in enumerate(x for x in results["runs"] if x["side"] == side and x.get("eval_curve")):
            t, ret = zip(*r["eval_curve"])
            ax.plot(t, ret, color=colours[side], alpha=0.8, label=side if i == 0 else None)
    if results.get("target_return") is not None:
        ax.axhline(results["target_return"], color="grey", linestyle="--", label="target")
    ax.set_xlabel("seconds since the command's start")
    ax.set_ylabel("greedy mean return")
    ax.set_title(f"{results['env']}: distrl ({results['config']}) and Stable-Baselines3")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path}")
