"""Stable-Baselines3 against distrl on MuJoCo, same criterion, same clock: SAC on HalfCheetah-v5 and PPO
on Hopper-v5.

    python -m bench.peers.sb3_mujoco --peer sac_halfcheetah|sac_halfcheetah_same|ppo_hopper|ppo_hopper_same
                                     [--seeds 0 1 2] [--budget-s S]
                                     [--no-ours | --no-sb3] [--lock /tmp/distrl-heavy.lock] [--out PATH]

Per seed, each a fresh process timed from its own start (`bench/peers/sb3_runs.py` runs both sides,
alternating): `distrl train` of the peer's config (its mode and workers, no TensorBoard) and this module in
child mode, SB3 2.9 on one torch thread. Criterion, from the config: every eval.interval_s of wall time,
eval.episodes (10) greedy episodes; solved at the first mean return >= eval.target_return, unsolved after
the budget (the config's stop.max_seconds). Requires `pip install -e .[peers,mujoco]`. `--lock` runs each
run under flock (the wait is outside its clock); the JSON keeps the runs of sides and seeds not re-run, and
a PNG beside it draws every run's return against wall time.

SB3's side, rl-baselines3-zoo's hyperparameters for the -v3 versions of these envs:
- sac_halfcheetah: SAC's defaults (256x256 MlpPolicy, Adam 3e-4, replay 1M, batch 256, one update per env
  step, tau 0.005, gamma 0.99, automatic entropy) with learning_starts 10,000;
- ppo_hopper: VecNormalize (observations and rewards, its gamma the algorithm's), 1 env, n_steps 512,
  batch 32, 5 epochs, gamma 0.999, GAE lambda 0.99, learning rate 9.80828e-5, entropy 0.00229519, clip 0.2,
  max_grad_norm 0.7, vf_coef 0.835671, separate 256x256 ReLU actor and critic, log_std_init -2, no
  orthogonal init. Its greedy evaluation normalizes observations with VecNormalize's statistics, frozen;
- ppo_hopper_same: distrl's settings (configs/ppo_hopper.yaml) on SB3's side: VecNormalize (clip 10),
  4 envs x 512 steps, 10 epochs of minibatches of 64 (32 per update), gamma 0.99, GAE lambda 0.95, Adam 3e-4,
  clip 0.2, max_grad_norm 0.5, vf_coef 0.5, no entropy bonus, 64x64 tanh actor and critic.
- sac_halfcheetah_same: distrl's settings (configs/sac_halfcheetah.yaml) on SB3's side: 4 envs, one update
  of 256 per env step (4 gradient steps per vector step), learning_starts 5,000 (uniform random actions
  until then, as distrl's random_steps), replay 1M, tau 0.005, gamma 0.99, initial temperature 1.0 learned
  towards -dim(A), Adam 3e-4 for actor and temperature and 1e-3 for the critics (SB3 has one learning rate
  for all three optimizers: a subclass sets the critics' after SB3 sets it each update).
JSON: bench/results/sb3_<peer>.json.
"""
from __future__ import annotations

import time

START = time.time()  # the child's clock: before any import, as distrl's cli starts its own

from bench.peers.sb3_runs import child_args, compare, run_child  # noqa: E402

PEERS = {
    "sac_halfcheetah": {"config": "configs/sac_halfcheetah.yaml", "env": "HalfCheetah-v5",
                        "hyperparameters": dict(learning_starts=10_000), "total_timesteps": 1_000_000},
    # distrl's own settings on SB3's side (configs/sac_halfcheetah.yaml): the frameworks compared.
    "sac_halfcheetah_same": {"config": "configs/sac_halfcheetah.yaml", "env": "HalfCheetah-v5", "n_envs": 4,
                             "hyperparameters": dict(learning_starts=5_000, buffer_size=1_000_000, batch_size=256,
                                                     tau=0.005, gamma=0.99, train_freq=1, gradient_steps=4,
                                                     learning_rate=3e-4, ent_coef="auto_1.0"),
                             "critic_lr": 1e-3, "total_timesteps": 1_000_000},
    "ppo_hopper": {"config": "configs/ppo_hopper.yaml", "env": "Hopper-v5",
                   "hyperparameters": dict(n_steps=512, batch_size=32, n_epochs=5, gamma=0.999, gae_lambda=0.99,
                                           learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2,
                                           max_grad_norm=0.7, vf_coef=0.835671),
                   "policy_kwargs": "dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, "
                                    "net_arch=dict(pi=[256, 256], vf=[256, 256]))",
                   "total_timesteps": 1_000_000},
    # distrl's own settings on SB3's side (configs/ppo_hopper.yaml): the frameworks compared, not the settings.
    "ppo_hopper_same": {"config": "configs/ppo_hopper.yaml", "env": "Hopper-v5", "n_envs": 4,
                        "hyperparameters": dict(n_steps=512, batch_size=64, n_epochs=10, gamma=0.99, gae_lambda=0.95,
                                                learning_rate=3e-4, ent_coef=0.0, clip_range=0.2, max_grad_norm=0.5,
                                                vf_coef=0.5),
                        "policy_kwargs": "dict(activation_fn=nn.Tanh, net_arch=dict(pi=[64, 64], vf=[64, 64]))",
                        "VecNormalize": dict(clip_obs=10.0, clip_reward=10.0), "total_timesteps": 1_000_000},
}
OPTIONS = {"--peer": dict(choices=sorted(PEERS), required=True, help="which algorithm and env")}


def child(args) -> None:
    """One SB3 run in this process; prints one JSON line."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from torch import nn  # noqa: F401 - named by the PPO peer's policy_kwargs

    torch.set_num_threads(1)
    peer = PEERS[args.peer]
    env_id = peer["env"]
    if args.peer.startswith("sac_"):
        model = sac_class(peer.get("critic_lr"))(
            "MlpPolicy", make_vec_env(env_id, n_envs=peer.get("n_envs", 1), seed=args.seed),
            **peer["hyperparameters"], seed=args.seed, device="cpu", verbose=0)
        run_child(model, lambda: gym.make(env_id), args, START, peer["total_timesteps"],
                  first_eval_after=peer["hyperparameters"]["learning_starts"])
        return
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    hp = peer["hyperparameters"]
    envs = VecNormalize(make_vec_env(env_id, n_envs=peer.get("n_envs", 1), seed=args.seed), gamma=hp["gamma"],
                        **peer.get("VecNormalize", {}))
    model = PPO("MlpPolicy", envs, **hp, policy_kwargs=eval(peer["policy_kwargs"]), seed=args.seed, device="cpu",
                verbose=0)
    run_child(model, lambda: gym.make(env_id), args, START, peer["total_timesteps"], normalize_obs=envs.normalize_obs)


def sac_class(critic_lr: float | None):
    """SB3's SAC, or SAC whose critics learn at `critic_lr`: SB3 sets every optimizer's rate from its one
    schedule before each update, so the critics' is set again after it."""
    from stable_baselines3 import SAC

    if critic_lr is None:
        return SAC

    class SACWithCriticLR(SAC):
        def _update_learning_rate(self, optimizers) -> None:
            super()._update_learning_rate(optimizers)
            for group in self.critic.optimizer.param_groups:
                group["lr"] = critic_lr

    return SACWithCriticLR


def settings(args) -> dict:
    peer = PEERS[args.peer]
    return {"peer": args.peer, **peer["hyperparameters"], "total_timesteps": peer["total_timesteps"],
            **({"critic_lr": peer["critic_lr"], "n_envs": peer["n_envs"]} if "critic_lr" in peer else {}),
            **({"policy_kwargs": peer["policy_kwargs"], "VecNormalize": peer.get("VecNormalize", True),
                "n_envs": peer.get("n_envs", 1)} if "policy_kwargs" in peer else {})}


if __name__ == "__main__":
    import sys

    if "--child" in sys.argv:
        child(child_args(OPTIONS))
    else:
        peer = sys.argv[sys.argv.index("--peer") + 1] if "--peer" in sys.argv else None
        if peer not in PEERS:
            raise SystemExit(f"--peer: one of {', '.join(sorted(PEERS))}")
        compare(__spec__.name, PEERS[peer]["config"], OPTIONS, lambda args, cfg: ["--peer", args.peer], settings,
                f"sb3_{peer}.json")
