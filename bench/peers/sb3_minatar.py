"""Stable-Baselines3 DQN against distrl's Ape-X DQN on MinAtar Breakout, same criterion, same clock.

    python -m bench.peers.sb3_minatar [--seeds 0 1 2] [--budget-s 1200] [--no-ours] [--lr 1e-4] [--out PATH]

Per seed, each a fresh process timed from its own start (Python, torch and the library's imports
included, as distrl's time to solve is): `distrl train configs/apex_dqn_minatar_breakout.yaml` (its mode
and workers, no TensorBoard) and this file as a script in child mode (`python bench/peers/sb3_minatar.py
--child SEED BUDGET_S`), SB3 2.9's DQN on one torch thread. Criterion, from the config: every
eval.interval_s (15 s) of wall time, 20 greedy episodes (one env each, seeded seed + 10_000 + 20 *
evaluation + episode as distrl's evaluator seeds them, TimeLimit 10_000 as in training); solved at the first
mean return >= 10; unsolved after the budget (1,200 s). distrl evaluates in a process of its own beside
training; SB3's evaluation runs inside its training loop, so the 15 s are counted from the end of the
previous evaluation to leave it 15 s of training between two. Requires `pip install -e .[peers]`.

SB3's side: `DQN("CnnPolicy")` with the MinAtar network of Young & Tian (2019) as its features extractor
(bools to floats, channels first, Conv 16 3x3 stride 1, ReLU, Linear 1024 -> 128, ReLU; 8x8x16 = 1024:
the conv is unpadded, as in MinAtar's own dqn.py and distrl's `minatar` torso) and `net_arch=[]`, so the
Q head is one Linear(128, actions), as distrl's. Hyperparameters: MinAtar's DQN (5M frames, replay 100k
started at 5k, batch 32, gamma 0.99, an update every step, target copy every 1,000 steps, epsilon 1.0 ->
0.1 over the first 100k steps, Huber loss as SB3's) expressed as rl-zoo expresses Nature DQN for Atari:
the paper's optimizer is centered RMSProp (lr 2.5e-4, alpha 0.95, eps 0.01); rl-zoo replaces Nature DQN's
RMSProp at that same 2.5e-4 with Adam at 1e-4, so SB3 runs Adam at 1e-4 (`--lr 2.5e-4` for the paper's
number under Adam). SB3's own defaults otherwise, as rl-zoo keeps them: gradient-norm clip 10 (the paper
has none), timeouts bootstrapped. distrl's config: single mode (rollout of 16 envs, replay and learner in
one process, so its `workers: 2` is unused), prioritized replay, 3-step returns, batch 256, Adam 5e-4.
JSON: bench/results/sb3_minatar.json.
"""
from __future__ import annotations

import time

START = time.time()  # the child's clock: before any import, as distrl's cli starts its own

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

CONFIG = "configs/apex_dqn_minatar_breakout.yaml"
ENV_ID = "MinAtar/Breakout-v1"
EVAL_SEED_OFFSET = 10_000  # distrl.roles.evaluation's: evaluation i plays seeds seed + offset + i * episodes + j
# MinAtar's DQN (Young & Tian 2019) in SB3's terms; learning_rate is the child's --lr.
HYPERPARAMETERS = dict(buffer_size=100_000, learning_starts=5_000, batch_size=32, gamma=0.99, train_freq=1,
                       gradient_steps=1, target_update_interval=1_000, exploration_initial_eps=1.0,
                       exploration_final_eps=0.1, optimize_memory_usage=False)
TOTAL_TIMESTEPS = 5_000_000  # the paper's run length: epsilon's schedule is a fraction of it
EPSILON_DECAY_STEPS = 100_000
DEFAULT_LR = 1e-4


def child(args) -> None:
    """One SB3 run in this process; prints one JSON line."""
    import gymnasium as gym
    import minatar.gym
    import numpy as np
    import stable_baselines3
    import torch
    from gymnasium.wrappers import TimeLimit
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    torch.set_num_threads(1)
    minatar.gym.register_envs()

    class MinAtarCNN(BaseFeaturesExtractor):
        """Young & Tian's network. The observation is a (10, 10, 4) bool Box: SB3 does not take it for an
        image (is_image_space wants uint8 in [0, 255]), so no VecTransposeImage and no /255 come before this:
        the extractor casts and puts the channels first itself, and no observation wrapper is needed."""

        def __init__(self, observation_space, features_dim: int = 128):
            super().__init__(observation_space, features_dim)
            h, w, c = observation_space.shape
            self.conv = nn.Sequential(nn.Conv2d(c, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
            self.fc = nn.Sequential(nn.Linear(16 * (h - 2) * (w - 2), features_dim), nn.ReLU())

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.fc(self.conv(obs.float().permute(0, 3, 1, 2)))

    def make_env():
        return TimeLimit(gym.make(ENV_ID), max_episode_steps=args.max_episode_steps)

    def evaluate(model, envs, seed: int) -> float:
        """Mean return of one greedy episode per env, env i seeded seed + i."""
        obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
        returns, running = np.zeros(len(envs)), np.ones(len(envs), bool)
        while running.any():
            rows = np.flatnonzero(running)
            actions, _ = model.predict(obs[rows], deterministic=True)
            for i, a in zip(rows, actions):
                obs[i], reward, term, trunc, _ = envs[i].step(int(a))
                returns[i] += reward
                running[i] = not (term or trunc)
        return float(returns.mean())

    class Solve(BaseCallback):
        def __init__(self):
            super().__init__()
            self.envs = [make_env() for _ in range(args.episodes)]
            self.evaluations, self.last_eval, self.best, self.solved_at = 0, START, -np.inf, None

        def _on_step(self) -> bool:
            if time.time() - START >= args.budget_s:
                return False
            if self.model.num_timesteps <= HYPERPARAMETERS["learning_starts"]:
                return True  # no update yet: distrl's first evaluation also waits for one
            if time.time() - self.last_eval < args.interval_s:
                return True
            seed = args.seed + EVAL_SEED_OFFSET + self.evaluations * args.episodes
            mean = evaluate(self.model, self.envs, seed)
            self.evaluations += 1
            self.last_eval = time.time()
            self.best = max(self.best, mean)
            if mean >= args.target:
                self.solved_at = self.last_eval - START
                return False
            return True

    model = DQN("CnnPolicy", make_env(), learning_rate=args.lr, **HYPERPARAMETERS,
                exploration_fraction=EPSILON_DECAY_STEPS / TOTAL_TIMESTEPS, seed=args.seed, device="cpu", verbose=0,
                policy_kwargs=dict(features_extractor_class=MinAtarCNN, features_extractor_kwargs=dict(features_dim=128),
                                   net_arch=[], normalize_images=False))
    solve = Solve()
    model.learn(total_timesteps=TOTAL_TIMESTEPS, callback=solve)
    print(json.dumps({"solved": solve.solved_at is not None, "time_to_solve_s": solve.solved_at,
                      "best_eval_return": solve.best if solve.evaluations else None, "env_steps": int(model.num_timesteps),
                      "wall_s": time.time() - START, "evaluations": solve.evaluations, "lr": args.lr,
                      "sb3": stable_baselines3.__version__}))


def sb3_once(seed: int, budget: float, lr: float, cfg) -> dict:
    """One SB3 run in a fresh process, with the evaluation and time limit of distrl's config `cfg`."""
    limit = next(w["TimeLimit"]["max_episode_steps"] for w in cfg.env.wrappers if isinstance(w, dict) and "TimeLimit" in w)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(seed), str(budget), "--lr", str(lr),
           "--interval-s", str(cfg.eval.interval_s), "--episodes", str(cfg.eval.episodes),
           "--target", str(cfg.eval.target_return), "--max-episode-steps", str(limit)]
    from bench.common import json_result

    return json_result(cmd, "SB3 run")


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


def main() -> None:
    from bench.common import ROOT, hardware, write_json
    from bench.solve import solve_once
    from distrl.config import load_config
    from distrl.roles.evaluation import EVAL_SEED_OFFSET as distrl_offset

    assert EVAL_SEED_OFFSET == distrl_offset, "the child must seed its evaluations as distrl's evaluator does"
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget-s", type=float, help="default: the config's stop.max_seconds (1200)")
    ap.add_argument("--no-ours", action="store_true", help="SB3 only")
    ap.add_argument("--lr", type=float, default=DEFAULT_LR, help="SB3's Adam learning rate")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "sb3_minatar.json"))
    args = ap.parse_args()
    cfg = load_config(os.path.join(ROOT, CONFIG))
    budget = args.budget_s or cfg.stop.max_seconds
    runs = []
    for seed in args.seeds:
        if not args.no_ours:  # alternating: both sides see the same machine load
            r = solve_once(CONFIG, cfg.mode, seed, cfg.workers, budget, ["log.tensorboard=false"])
            r = {"side": "distrl", "seed": seed, **{k: r[k] for k in ("solved", "time_to_solve_s", "best_eval_return",
                                                                      "env_steps", "wall_s", "mode", "workers")}}
            runs.append(r)
            print(json.dumps(r), flush=True)
        r = {"side": "sb3", "seed": seed, **sb3_once(seed, budget, args.lr, cfg)}
        runs.append(r)
        print(json.dumps(r), flush=True)
    results = {"hardware": hardware(), "config": CONFIG, "env": ENV_ID, "budget_s": budget,
               "sb3_hyperparameters": {**HYPERPARAMETERS, "learning_rate": args.lr, "optimizer": "Adam",
                                       "exploration_fraction": EPSILON_DECAY_STEPS / TOTAL_TIMESTEPS,
                                       "total_timesteps": TOTAL_TIMESTEPS, "torch_threads": 1},
               "runs": runs, "summary": summarise(runs, budget)}
    write_json(args.out, results)
    print(table(results["summary"]))


def child_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2, metavar=("SEED", "BUDGET_S"), required=True)
    ap.add_argument("--lr", type=float, default=DEFAULT_LR)
    ap.add_argument("--interval-s", type=float, default=15.0)
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--target", type=float, default=10.0)
    ap.add_argument("--max-episode-steps", type=int, default=10_000)
    args = ap.parse_args()
    args.seed, args.budget_s = int(args.child[0]), float(args.child[1])
    return args


if __name__ == "__main__":
    child(child_args()) if "--child" in sys.argv else main()
