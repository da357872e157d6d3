"""DHC on MPE's simple_spread_v3 against a random and a scripted policy, scored the same way.

    python -m bench.simple_spread [--episodes 200] [--seeds 0 1 2] [--max-seconds 600]

Every policy is scored by the evaluator's own `play_greedy` on the same seeded episodes, so the
numbers are the mean per-agent episode return the learning curves show. The random policy picks
uniform actions; the scripted one assigns agents to landmarks once per episode (minimum total
distance, scipy's `linear_sum_assignment`) and steers each agent to its landmark with a damped
controller on the discrete moves. The learned policy is `configs/dhc_simple_spread.yaml` trained for
`--max-seconds` per seed (in its own process, `distrl train`), then replayed from its best
checkpoint on the same episodes. "Gap closed" = (learned - random) / (scripted - random); the
target is >= 0.5.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
from scipy.optimize import linear_sum_assignment

from bench.common import ROOT, hardware, write_json
from distrl.checkpoint import load_weights
from distrl.config import load_config
from distrl.core import Policy
from distrl.roles.evaluation import play_greedy
from distrl.roles.factory import acting_policy

CONFIG = os.path.join(ROOT, "configs", "dhc_simple_spread.yaml")
EVAL_SEED = 90_000  # episodes none of the training runs evaluates on
MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.float32)  # no-op, left, right, down, up


class RandomPolicy(Policy):
    def __init__(self, num_actions: int, seed: int):
        self.num_actions, self.rng = num_actions, np.random.default_rng(seed)

    def set_weights(self, weights, version):
        pass

    def act(self, obs, explore):
        return self.rng.integers(self.num_actions, size=obs["obs"].shape[:2]), {}

    def postprocess(self, traj):
        raise NotImplementedError("an evaluation-only policy")


class ScriptedPolicy(RandomPolicy):
    """simple_spread observations start with own velocity (2), own position (2), then each landmark's
    position relative to the agent (2 each)."""

    def __init__(self, num_agents: int, damping: float = 0.2):
        self.num_agents, self.damping = num_agents, damping
        self.targets: np.ndarray | None = None  # (E, A) landmark of each agent

    def episodes_ended(self, done):
        if self.targets is not None:
            self.targets[done] = -1

    def act(self, obs, explore):
        x = obs["obs"]
        vel = x[..., 0:2]
        rel = x[..., 4:4 + 2 * self.num_agents].reshape(*x.shape[:2], self.num_agents, 2)
        if self.targets is None or self.targets.shape[0] != x.shape[0]:
            self.targets = np.full(x.shape[:2], -1)
        for e in np.flatnonzero((self.targets < 0).any(axis=1)):
            cost = np.linalg.norm(rel[e], axis=-1)  # (agents, landmarks)
            _, self.targets[e] = linear_sum_assignment(cost)
        goal = np.take_along_axis(rel, self.targets[..., None, None], axis=2)[:, :, 0]
        steer = goal - self.damping * vel
        scores = steer @ MOVES.T  # the move most aligned with where the agent should accelerate
        scores[..., 0] = 0.02  # stay when close and slow (beats every small move)
        return scores.argmax(-1), {}


def score(policy: Policy, cfg, episodes: int) -> float:
    rets, _ = play_greedy(policy, cfg.env.id, episodes, EVAL_SEED, cfg.env.kwargs, multi_agent=True)
    return float(np.mean(rets))


def train_and_score(seed: int, max_seconds: float, episodes: int) -> dict:
    run_dir = tempfile.mkdtemp(prefix=f"spread-{seed}-")
    os.rmdir(run_dir)
    cmd = [sys.executable, "-m", "distrl.cli", "train", CONFIG, "--seed", str(seed), "--max-seconds",
           str(max_seconds), "--run-dir", run_dir, "--set", "log.progress=false",
           "--set", "eval.target_return=null"]  # the whole budget: the config's target stops at the threshold
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    cfg = load_config(os.path.join(run_dir, "config.yaml"))
    policy = acting_policy(cfg, -1, 1)
    weights, _ = load_weights(os.path.join(run_dir, "checkpoints", "best.safetensors"))
    policy.set_weights(weights, 0)
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    return {"seed": seed, "learned": score(policy, cfg, episodes), "env_steps": summary["env_steps"],
            "wall_s": summary["wall_s"], "best_eval_return": summary["best_eval_return"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--max-seconds", type=float, default=600.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "simple_spread.json"))
    args = ap.parse_args()
    cfg = load_config(CONFIG)
    n = cfg.env.kwargs["N"]
    random_ret = score(RandomPolicy(5, 0), cfg, args.episodes)
    scripted_ret = score(ScriptedPolicy(n), cfg, args.episodes)
    print(f"random {random_ret:.2f}  scripted {scripted_ret:.2f}", flush=True)
    runs = []
    for seed in args.seeds:
        run = train_and_score(seed, args.max_seconds, args.episodes)
        run["gap_closed"] = (run["learned"] - random_ret) / (scripted_ret - random_ret)
        runs.append(run)
        print(f"seed {seed}: learned {run['learned']:.2f}  gap closed {run['gap_closed']:.2f}", flush=True)
        out = {"command": "python -m bench.simple_spread " + " ".join(sys.argv[1:]), "hardware": hardware(),
               "episodes": args.episodes, "random": random_ret, "scripted": scripted_ret, "runs": runs,
               "median_gap_closed": statistics.median(r["gap_closed"] for r in runs), "target_gap_closed": 0.5}
        write_json(args.out, out)  # after every seed: an invocation stopped early keeps what it measured


if __name__ == "__main__":
    main()
