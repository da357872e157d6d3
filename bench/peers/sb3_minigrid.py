"""Stable-Baselines3 PPO against distrl's PPO on MiniGrid-DoorKey-5x5-v0, same criterion, same clock.

    python -m bench.peers.sb3_minigrid [--policy flat|multi-input|flat-uint8|same] [--seeds 0 1 2] [--budget-s 600]
                                       [--no-ours | --no-sb3] [--lock LOCK] [--out PATH]

Per seed, each a fresh process (`bench/peers/sb3_runs.py` runs and times both sides, alternating):
`distrl train configs/ppo_minigrid_doorkey.yaml` (single mode, the Dict observation's image and direction,
no TensorBoard) and this module in child mode, SB3 2.9's PPO on one torch thread. Criterion, from the
config: every eval.interval_s (5 s) of wall time, 20 greedy episodes (MiniGrid's own limit of 250 steps);
solved at the first mean return >= 0.9; unsolved after the budget (600 s). Requires `pip install -e
.[peers]` and minigrid (in the dev environment).

SB3's side: rl-baselines3-zoo's PPO for MiniGrid-DoorKey-5x5-v0 (hyperparams/ppo.yml, its minigrid
defaults): VecNormalize (observations and rewards, clip 10, its gamma the algorithm's), 8 envs in a
DummyVecEnv, n_steps 128 (1,024 per update), batch_size 64, 10 epochs, gamma 0.99, GAE lambda 0.95,
Adam 2.5e-4, clip 0.2, no entropy bonus, SB3's defaults otherwise (vf_coef 0.5, max_grad_norm 0.5,
separate 64x64 tanh actor and critic). rl-zoo trains for 1e5 steps; nothing here anneals, so the run is
not cut short by a step count: it ends when solved or at the budget. Greedy evaluation: envs built as the
training env's, observations normalized with VecNormalize's statistics of the moment, frozen (rl-zoo's
own evaluation's), raw rewards. Observation:
- `--policy flat` (rl-zoo's, the main row): minigrid's FlatObsWrapper (the 7x7x3 view and the mission
  string one-hot, 2,835 entries; no direction), cast to float32, and MlpPolicy. The cast is needed on SB3
  2.9: its RolloutBuffer stores observations in the observation space's dtype, and VecNormalize keeps a
  uint8 space that is not an image, so the normalized observations PPO trains on would be cast back to
  uint8 (truncated, negatives wrapped) while it acts on the right ones;
- `--policy flat-uint8`: the same without the cast, as rl-zoo's settings run on SB3 2.9 unchanged. Its
  training return falls to 0 within about 65k steps (seed 0) and no seed solves within 600 s;
- `--policy multi-input`: the Dict observation distrl acts on (gymnasium's FilterObservation keeps image
  and direction, the mission dropped) and MultiInputPolicy, rl-zoo's numbers otherwise. The image is
  cast to float32 so that SB3 flattens it (as distrl's `encoders: {image: flat}` does) instead of giving a
  7x7 view to its NatureCNN, which does not fit one; VecNormalize normalizes the image (a Discrete
  cannot be), the direction is one-hot.
distrl's config: 16 envs x 128 steps, 10 epochs of 8 minibatches (256 each), Adam 2.5e-4, gamma 0.99,
GAE lambda 0.95, no entropy bonus, no observation or reward normalization, 64x64 tanh torsos (unshared).
`--ours-from bench/results/sb3_minigrid.json` (sb3_runs' option) compares another row against the flat
row's distrl runs without re-running them.

`--policy same`: distrl's settings on both sides, the frameworks compared. SB3's PPO reads them from the
config: its envs, rollout length, epochs, minibatch size (a rollout over the config's minibatches), Adam's
learning rate, gamma, GAE lambda, entropy, clip, max_grad_norm, vf_coef; MultiInputPolicy on the same Dict
(image and direction), the image's codes as they are (SB3 flattens a Box that is not an image without
scaling it, as distrl's `codes` encoder does), the direction one-hot on both sides, separate 64x64 tanh
actor and critic (distrl's network), no VecNormalize (distrl's config normalizes nothing).
JSON: bench/results/sb3_minigrid.json (flat), sb3_minigrid_multi_input.json, sb3_minigrid_flat_uint8.json,
sb3_minigrid_same.json.
"""
from __future__ import annotations

import os
import time

START = time.time()  # the child's clock: before any import, as distrl's cli starts its own

from bench.peers.sb3_runs import child_args, compare, run_child  # noqa: E402

CONFIG = "configs/ppo_minigrid_doorkey.yaml"
ENV_ID = "MiniGrid-DoorKey-5x5-v0"
N_ENVS = 8
HYPERPARAMETERS = dict(n_steps=128, batch_size=64, n_epochs=10, gamma=0.99, gae_lambda=0.95, learning_rate=2.5e-4,
                       clip_range=0.2, ent_coef=0.0)
TOTAL_TIMESTEPS = 10**9  # never reached within the budget
POLICIES = {"flat": "MlpPolicy", "multi-input": "MultiInputPolicy", "flat-uint8": "MlpPolicy",
            "same": "MultiInputPolicy"}
OBSERVATIONS = {"flat": "minigrid FlatObsWrapper, float32", "multi-input": "Dict image (float32) + direction",
                "flat-uint8": "minigrid FlatObsWrapper, uint8 as it comes",
                "same": "Dict image (float32 codes, not normalized) + direction"}
OPTIONS = {"--policy": dict(choices=sorted(POLICIES), default="flat",
                            help="flat: rl-zoo's FlatObsWrapper (float32) and MlpPolicy; multi-input: the Dict "
                                 "observation; flat-uint8: FlatObsWrapper's uint8 kept")}


def make_env_fn(policy: str):
    """The env constructor of `policy`'s observation (training and evaluation alike)."""
    import gymnasium as gym
    import minigrid  # noqa: F401 - registers the MiniGrid ids
    import numpy as np
    from gymnasium import spaces

    def flat(cast: bool = True):
        from minigrid.wrappers import FlatObsWrapper

        env = FlatObsWrapper(gym.make(ENV_ID))
        if not cast:
            return env
        space = spaces.Box(0.0, 255.0, env.observation_space.shape, np.float32)
        return gym.wrappers.TransformObservation(env, lambda o: o.astype(np.float32), space)

    def multi_input():
        env = gym.wrappers.FilterObservation(gym.make(ENV_ID), ["image", "direction"])
        image = env.observation_space["image"]
        space = spaces.Dict({**env.observation_space.spaces, "image": spaces.Box(0.0, 255.0, image.shape, np.float32)})
        return gym.wrappers.TransformObservation(env, lambda o: {**o, "image": o["image"].astype(np.float32)}, space)

    return {"flat": flat, "multi-input": multi_input, "flat-uint8": lambda: flat(cast=False),
            "same": multi_input}[policy]


def same_settings() -> tuple[int, dict]:
    """(envs, SB3 PPO's keyword arguments) of distrl's config: `--policy same`."""
    from bench.common import ROOT
    from distrl.config import load_config

    cfg = load_config(os.path.join(ROOT, CONFIG))
    ppo, envs, steps = cfg.algo_config, cfg.env.num_envs, cfg.rollout.fragment_length
    assert cfg.model.activation == "tanh" and cfg.model.hidden == [64, 64] and not ppo.shared_torso, \
        "the same-settings row assumes distrl's 64x64 tanh, unshared actor and critic"
    return envs, dict(n_steps=steps, batch_size=envs * steps // ppo.minibatches, n_epochs=ppo.epochs,
                      learning_rate=ppo.lr, gamma=ppo.gamma, gae_lambda=ppo.gae_lambda, ent_coef=ppo.ent_coef,
                      clip_range=ppo.clip, max_grad_norm=ppo.grad_clip, vf_coef=ppo.vf_coef,
                      normalize_advantage=ppo.normalize_advantages)


def child(args) -> None:
    """One SB3 run in this process; prints one JSON line."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    make_env = make_env_fn(args.policy)
    if args.policy == "same":
        n_envs, hyperparameters = same_settings()
        envs = make_vec_env(make_env, n_envs=n_envs, seed=args.seed)
        model = PPO("MultiInputPolicy", envs, **hyperparameters, seed=args.seed, device="cpu", verbose=0)
        run_child(model, make_env, args, START, TOTAL_TIMESTEPS)
        return
    keys = {"norm_obs_keys": ["image"]} if args.policy == "multi-input" else {}
    envs = VecNormalize(make_vec_env(make_env, n_envs=N_ENVS, seed=args.seed), gamma=HYPERPARAMETERS["gamma"], **keys)
    model = PPO(POLICIES[args.policy], envs, **HYPERPARAMETERS, seed=args.seed, device="cpu", verbose=0)
    run_child(model, make_env, args, START, TOTAL_TIMESTEPS, normalize_obs=envs.normalize_obs)


def settings(args) -> dict:
    if args.policy == "same":
        n_envs, hyperparameters = same_settings()
        return {"policy": "MultiInputPolicy", "observation": OBSERVATIONS["same"], "n_envs": n_envs,
                **hyperparameters, "net_arch": "64x64 tanh, actor and critic apart", "settings": f"distrl's {CONFIG}"}
    return {"policy": POLICIES[args.policy], "observation": OBSERVATIONS[args.policy], "n_envs": N_ENVS, **HYPERPARAMETERS, "VecNormalize": {"gamma": HYPERPARAMETERS["gamma"]},
            "settings": "rl-zoo hyperparams/ppo.yml MiniGrid-DoorKey-5x5-v0"}


if __name__ == "__main__":
    import sys

    if "--child" in sys.argv:
        child(child_args(OPTIONS))
    else:
        policy = sys.argv[sys.argv.index("--policy") + 1] if "--policy" in sys.argv else "flat"
        out = "sb3_minigrid.json" if policy == "flat" else f"sb3_minigrid_{policy.replace('-', '_')}.json"
        compare(__spec__.name, CONFIG, OPTIONS, lambda args, cfg: ["--policy", args.policy], settings, out)
