"""sb3-contrib's MaskablePPO against distrl's PPO on Taxi-v4 with its action mask, same criterion, same clock.

    python -m bench.peers.sb3_taxi_masked [--seeds 0 1 2] [--budget-s 300] [--no-ours | --no-sb3] [--lock LOCK]
                                          [--out PATH]

Per seed, each a fresh process (`bench/peers/sb3_runs.py` runs and times both sides, alternating):
`distrl train configs/ppo_taxi_masked.yaml` (single mode, env.action_mask: info, no TensorBoard) and this
module in child mode, sb3-contrib 2.9's MaskablePPO on one torch thread. Criterion, from the config: every
eval.interval_s (5 s) of wall time, 20 greedy episodes (Taxi-v4's TimeLimit of 200 steps); solved at the
first mean return >= 7.0; unsolved after the budget (300 s). Requires `pip install -e .[peers]` (SB3 and
sb3-contrib 2.9).

The mask, on both sides, is Taxi's `info["action_mask"]` (reset's and every step's): SB3's env keeps the
latest one and sb3-contrib's ActionMasker hands it to MaskablePPO, which samples and takes its greedy
action among the legal ones only; its evaluation env is built as its training env and its greedy actions
are `predict(obs, deterministic=True, action_masks=...)`.

SB3's side: rl-baselines3-zoo has no PPO settings for Taxi, so MaskablePPO runs distrl's config's numbers:
16 envs in a DummyVecEnv, rollouts of 64 steps (1,024 per update), 4 epochs of 4 minibatches (batch_size
256), Adam 1e-3, gamma 0.99, GAE lambda 0.95, entropy 0.01, clip 0.2, vf_coef 0.5, max_grad_norm 0.5
(distrl's defaults, SB3's too), separate 64x64 ReLU actor and critic (distrl's network: unshared torsos,
ReLU), the Discrete(500) observation one-hot on both sides. The run is not cut short by a step count
(nothing anneals): it ends when solved or at the budget.

What the mask buys, distrl alone, same seeds:
    python -m bench.solve --config configs/ppo_taxi_masked.yaml --set env.action_mask=none \\
        --set log.tensorboard=false --out bench/results/solve_ppo_taxi_unmasked.json
JSON: bench/results/sb3_taxi_masked.json.
"""
from __future__ import annotations

import time

START = time.time()  # the child's clock: before any import, as distrl's cli starts its own

from bench.peers.sb3_runs import child_args, compare, run_child  # noqa: E402

CONFIG = "configs/ppo_taxi_masked.yaml"
ENV_ID = "Taxi-v4"
N_ENVS = 16
HYPERPARAMETERS = dict(n_steps=64, batch_size=256, n_epochs=4, learning_rate=1e-3, gamma=0.99, gae_lambda=0.95,
                       ent_coef=0.01, clip_range=0.2, vf_coef=0.5, max_grad_norm=0.5)
POLICY_KWARGS = "dict(activation_fn=nn.ReLU, net_arch=dict(pi=[64, 64], vf=[64, 64]))"
TOTAL_TIMESTEPS = 10**9  # never reached within the budget


def child(args) -> None:
    """One SB3 run in this process; prints one JSON line."""
    import gymnasium as gym
    import torch
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.wrappers import ActionMasker
    from stable_baselines3.common.env_util import make_vec_env
    from torch import nn  # noqa: F401 - named by POLICY_KWARGS

    torch.set_num_threads(1)

    class InfoMask(gym.Wrapper):
        """Keeps the latest info["action_mask"] (reset's or step's) for ActionMasker to read."""

        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            self.mask = info["action_mask"]
            return obs, info

        def step(self, action):
            obs, reward, term, trunc, info = self.env.step(action)
            self.mask = info["action_mask"]
            return obs, reward, term, trunc, info

    def make_env():
        return ActionMasker(InfoMask(gym.make(ENV_ID)), lambda env: env.mask)

    model = MaskablePPO("MlpPolicy", make_vec_env(make_env, n_envs=N_ENVS, seed=args.seed), **HYPERPARAMETERS,
                        policy_kwargs=eval(POLICY_KWARGS), seed=args.seed, device="cpu", verbose=0)
    run_child(model, make_env, args, START, TOTAL_TIMESTEPS, action_masks=lambda env: env.action_masks())


def settings(args) -> dict:
    import sb3_contrib

    return {"algorithm": "sb3_contrib.MaskablePPO", "sb3_contrib": sb3_contrib.__version__, "policy": "MlpPolicy",
            "policy_kwargs": POLICY_KWARGS, "n_envs": N_ENVS, **HYPERPARAMETERS,
            "mask": "info['action_mask'] via ActionMasker", "settings": "distrl's config (rl-zoo has no PPO for Taxi)"}


if __name__ == "__main__":
    import sys

    if "--child" in sys.argv:
        child(child_args())
    else:
        compare(__spec__.name, CONFIG, {}, lambda args, cfg: [], settings, "sb3_taxi_masked.json")
