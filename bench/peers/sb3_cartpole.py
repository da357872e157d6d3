"""Stable-Baselines3 PPO against distrl's PPO on CartPole-v1, same criterion, same clock.

    python -m bench.peers.sb3_cartpole [--settings rl-zoo|distrl] [--seeds 0 1 2 3 4] [--budget-s 300] [--no-ours]
                                       [--out PATH]

Per seed, each a fresh process (`bench/peers/sb3_runs.py` runs and times both sides):
`distrl train configs/ppo_cartpole.yaml` (its mode and workers, no TensorBoard) and this module in child
mode, SB3 2.9's PPO on one torch thread. Criterion, from the config: every eval.interval_s (0.5 s) of wall
time, 20 greedy episodes; solved at the first mean return >= 475; unsolved after the budget (300 s) or
when SB3's run of 100k steps ends. Requires `pip install -e .[peers]`.

SB3's side: rl-baselines3-zoo's tuned PPO for CartPole-v1 (8 envs in a DummyVecEnv, rollouts of 32,
one minibatch of 256, 20 epochs, gamma 0.98, GAE lambda 0.8, no entropy bonus, learning rate 1e-3 and
clip range 0.2 both annealed linearly to 0 over 100k steps) and SB3's MlpPolicy (separate 64x64 tanh
actor and critic). distrl's config holds the same numbers with constant learning rate and clip range,
and its own network (64x64, shared by policy and value unless the config says otherwise). `--settings
distrl`: SB3 with the config's constant learning rate and clip range (its MlpPolicy kept).
JSON: bench/results/sb3_cartpole.json (rl-zoo), sb3_cartpole_same.json (distrl's settings).
"""
from __future__ import annotations

import time

START = time.time()  # the child's clock: before any import, as distrl's cli starts its own

from bench.peers.sb3_runs import child_args, compare, run_child  # noqa: E402

CONFIG = "configs/ppo_cartpole.yaml"
ENV_ID = "CartPole-v1"
N_ENVS = 8
TOTAL_TIMESTEPS = 100_000  # rl-zoo's run length: both schedules anneal over it
HYPERPARAMETERS = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0)
LEARNING_RATE, CLIP_RANGE = 1e-3, 0.2  # rl-zoo: each times SB3's progress_remaining (1 -> 0); distrl: constant
OPTIONS = {"--settings": dict(choices=["rl-zoo", "distrl"], default="rl-zoo", help="rl-zoo's schedules, or distrl's")}


def schedule(value: float, settings: str):
    return (lambda remaining: value * remaining) if settings == "rl-zoo" else value


def child(args) -> None:
    """One SB3 run in this process; prints one JSON line."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    model = PPO("MlpPolicy", make_vec_env(ENV_ID, n_envs=N_ENVS, seed=args.seed), **HYPERPARAMETERS,
                learning_rate=schedule(LEARNING_RATE, args.settings), clip_range=schedule(CLIP_RANGE, args.settings),
                seed=args.seed, device="cpu", verbose=0)
    run_child(model, lambda: gym.make(ENV_ID), args, START, TOTAL_TIMESTEPS)


def settings(args) -> dict:
    kind = "linear {} -> 0" if args.settings == "rl-zoo" else "constant {}"
    return {**HYPERPARAMETERS, "n_envs": N_ENVS, "settings": args.settings, "learning_rate": kind.format(LEARNING_RATE),
            "clip_range": kind.format(CLIP_RANGE), "total_timesteps": TOTAL_TIMESTEPS, "policy": "MlpPolicy"}


if __name__ == "__main__":
    import sys

    if "--child" in sys.argv:
        child(child_args(OPTIONS))
    else:
        same = "--settings" in sys.argv and sys.argv[sys.argv.index("--settings") + 1] == "distrl"
        compare(__spec__.name, CONFIG, OPTIONS, lambda args, cfg: ["--settings", args.settings], settings,
                "sb3_cartpole_same.json" if same else "sb3_cartpole.json")
