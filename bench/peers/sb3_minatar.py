"""Stable-Baselines3 DQN against distrl's Ape-X DQN on MinAtar Breakout, same criterion, same clock.

    python -m bench.peers.sb3_minatar [--seeds 0 1 2] [--budget-s 1200] [--no-ours] [--lr 1e-4] [--same] [--out PATH]

Per seed, each a fresh process (`bench/peers/sb3_runs.py` runs and times both sides):
`distrl train configs/apex_dqn_minatar_breakout.yaml` (its mode and workers, no TensorBoard) and this module
in child mode, SB3 2.9's DQN on one torch thread. Criterion, from the config: every eval.interval_s (15 s)
of wall time, 20 greedy episodes (TimeLimit 10,000 as in training); solved at the first mean return >= 10;
unsolved after the budget (1,200 s). Requires `pip install -e .[peers]`.

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

`--same`: one set of settings on both sides, the frameworks compared. distrl's config without the parts
SB3's DQN lacks (prioritized replay, the double-DQN target, the dueling head: `--set`s on distrl's side),
and SB3 given the rest of it: 16 envs, replay 500k started at 5k, batch 256, 3-step returns, one update per
64 env steps (train_freq 4 vector steps), a target copy every 500 updates (32,000 env steps), epsilon
1.0 -> 0.05 over 200k env steps, Adam 5e-4, gradient-norm clip 10, Huber loss.
JSON: bench/results/sb3_minatar_same.json.
"""
from __future__ import annotations

import time

START = time.time()  # the child's clock: before any import, as distrl's cli starts its own

from bench.peers.sb3_runs import child_args, compare, run_child  # noqa: E402

CONFIG = "configs/apex_dqn_minatar_breakout.yaml"
ENV_ID = "MinAtar/Breakout-v1"
# MinAtar's DQN (Young & Tian 2019) in SB3's terms; learning_rate is the child's --lr.
HYPERPARAMETERS = dict(buffer_size=100_000, learning_starts=5_000, batch_size=32, gamma=0.99, train_freq=1,
                       gradient_steps=1, target_update_interval=1_000, exploration_initial_eps=1.0,
                       exploration_final_eps=0.1, optimize_memory_usage=False)
TOTAL_TIMESTEPS = 5_000_000  # the paper's run length: epsilon's schedule is a fraction of it
EPSILON_DECAY_STEPS = 100_000
DEFAULT_LR = 1e-4
# configs/apex_dqn_minatar_breakout.yaml in SB3's terms (--same); the learning rate is its apex_dqn.lr.
SAME_NUM_ENVS = 16
SAME_HYPERPARAMETERS = dict(buffer_size=500_000, learning_starts=5_000, batch_size=256, gamma=0.99, train_freq=4,
                            gradient_steps=1, target_update_interval=500 * 64, exploration_initial_eps=1.0,
                            exploration_final_eps=0.05, n_steps=3, max_grad_norm=10.0, optimize_memory_usage=False)
SAME_LR = 5e-4
SAME_EPSILON_DECAY_STEPS = 200_000
# What distrl's Ape-X DQN has and SB3's DQN does not: off on distrl's side of the --same row.
SAME_DISTRL_OVERRIDES = ["replay.prioritized=false", "apex_dqn.double=false", "apex_dqn.dueling=false"]
OPTIONS = {"--lr": dict(type=float, default=DEFAULT_LR, help="SB3's Adam learning rate (not with --same)"),
           "--same": dict(action="store_true", help="distrl's settings on both sides")}


def child(args) -> None:
    """One SB3 run in this process; prints one JSON line."""
    import gymnasium as gym
    import minatar.gym
    import torch
    from gymnasium.wrappers import TimeLimit
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env
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

    if args.same:
        envs = make_vec_env(make_env, n_envs=SAME_NUM_ENVS, seed=args.seed)
        hp = dict(learning_rate=SAME_LR, **SAME_HYPERPARAMETERS,
                  exploration_fraction=SAME_EPSILON_DECAY_STEPS / TOTAL_TIMESTEPS)
    else:
        envs = make_env()
        hp = dict(learning_rate=args.lr, **HYPERPARAMETERS, exploration_fraction=EPSILON_DECAY_STEPS / TOTAL_TIMESTEPS)
    model = DQN("CnnPolicy", envs, **hp, seed=args.seed, device="cpu", verbose=0,
                policy_kwargs=dict(features_extractor_class=MinAtarCNN, features_extractor_kwargs=dict(features_dim=128),
                                   net_arch=[], normalize_images=False))
    run_child(model, make_env, args, START, TOTAL_TIMESTEPS, first_eval_after=hp["learning_starts"])


def child_options(args, cfg) -> list[str]:
    """The child's own arguments: the learning rate and the config's training TimeLimit."""
    limit = next(w["TimeLimit"]["max_episode_steps"] for w in cfg.env.wrappers if isinstance(w, dict) and "TimeLimit" in w)
    return ["--lr", str(args.lr), "--max-episode-steps", str(limit), *(["--same"] if args.same else [])]


def settings(args) -> dict:
    if args.same:
        return {**SAME_HYPERPARAMETERS, "learning_rate": SAME_LR, "optimizer": "Adam", "n_envs": SAME_NUM_ENVS,
                "exploration_fraction": SAME_EPSILON_DECAY_STEPS / TOTAL_TIMESTEPS, "total_timesteps": TOTAL_TIMESTEPS}
    return {**HYPERPARAMETERS, "learning_rate": args.lr, "optimizer": "Adam",
            "exploration_fraction": EPSILON_DECAY_STEPS / TOTAL_TIMESTEPS, "total_timesteps": TOTAL_TIMESTEPS}


if __name__ == "__main__":
    import sys

    if "--child" in sys.argv:
        child(child_args(OPTIONS))
    else:
        same = "--same" in sys.argv
        compare(__spec__.name, CONFIG, OPTIONS, child_options, settings,
                "sb3_minatar_same.json" if same else "sb3_minatar.json",
                ours_overrides=lambda args: SAME_DISTRL_OVERRIDES if args.same else [])
