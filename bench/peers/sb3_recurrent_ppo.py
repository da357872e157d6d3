"""sb3-contrib's RecurrentPPO against distrl's PPO with an LSTM on CartPole without velocities, same
criterion, same clock.

    python -m bench.peers.sb3_recurrent_ppo [--same-settings] [--seeds 0 1 2] [--budget-s 300]
                                            [--no-ours | --no-sb3] [--ours-from JSON] [--lock LOCK] [--out PATH]

Per seed, each a fresh process (`bench/peers/sb3_runs.py` runs and times both sides, alternating):
`distrl train configs/ppo_lstm_position_only_cartpole.yaml` (single mode, no TensorBoard) and this module
in child mode, sb3-contrib 2.9's RecurrentPPO (MlpLstmPolicy) on one torch thread. Both sides train and
evaluate on popgym's PositionOnlyCartPoleEasy (`popgym.envs.position_only_cartpole`): CartPole with only
the cart position and pole angle observed, episodes truncated at 200 steps, each step's reward 1/200 (so
a full episode returns 1.0; the terminating step too, CartPole's reward of 1 being transformed). It is
rl-zoo's CartPoleNoVel-v1 (CartPole-v1 with the velocities dropped, 500 steps, reward 1) with a shorter
limit and returns scaled by 1/200. Criterion, from the config: every eval.interval_s (5 s) of wall time,
20 greedy episodes (one env each, seeded as distrl's evaluator seeds them); solved at the first mean
return >= 0.95; unsolved after the budget (300 s), counted as the budget in the medians. Requires
`pip install -e .[peers]` (SB3 and sb3-contrib 2.9) and popgym.

Greedy evaluation carries the LSTM state: the 20 episodes run as one batch through
`predict(obs, state=state, episode_start=starts, deterministic=True)`, the state None and episode_start
true at the first step (RecurrentPPO zeroes the state there), the state returned by each call passed to
the next; an env whose episode has ended keeps its row in the batch (its last observation, its action
ignored) so that the rows of the state stay the envs'. `sb3_runs.evaluate` (one `predict` without
state, over the envs still running) does not fit a recurrent policy, and `sb3_runs.run_child` calls it
with no way to pass another, so the child replaces `sb3_runs.evaluate` by `evaluate_recurrent` before
calling `run_child` (the harness is used unchanged otherwise).

SB3 rows:
- default (`bench/results/sb3_recurrent_ppo.json`): rl-baselines3-zoo's tuned RecurrentPPO for
  CartPoleNoVel-v1 (hyperparams/ppo_lstm.yml; its published sb3/ppo_lstm-CartPoleNoVel-v1 model card
  lists them): MlpLstmPolicy, 8 envs (DummyVecEnv), n_steps 32 (256 per update), batch_size 256 (one
  minibatch per epoch), 20 epochs, gamma 0.98, GAE lambda 0.8, learning rate lin_0.001 and clip range
  lin_0.2 (linear from 1e-3 and 0.2 to 0 over n_timesteps 1e5), no entropy bonus, SB3's defaults
  otherwise (vf_coef 0.5, max_grad_norm 0.5, advantages normalized), VecNormalize of observations only
  (norm_obs true, norm_reward false; clip 10), policy_kwargs dict(ortho_init=False,
  activation_fn=nn.ReLU, lstm_hidden_size=64, enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64]))
  (the card's `net_arch=[dict(...)]`, the list form SB3 2 no longer takes, written as the dict): the
  observation goes to an LSTM of 64 for the actor and another of 64 for the critic, then a 64 ReLU layer
  each, then the heads. The schedules anneal over 1e5 steps, so the run learns for rl-zoo's
  total_timesteps of 1e5 (100,096: 391 rollouts of 256) and stops there: a seed that has not met the
  criterion by then (or by the budget) is unsolved. Greedy evaluation normalizes observations with
  VecNormalize's statistics of the moment, frozen (rl-zoo's own evaluation's). rl-zoo tuned these on
  CartPoleNoVel's reward of 1 a step and 500 steps; here rewards are 1/200 a step and the limit 200 (no
  reward normalization on either side; advantages are normalized, and the critic's parameters are its own
  under Adam, so the scale matters mostly through gamma and lambda's horizon against the 200-step limit).
- `--same-settings` (`bench/results/sb3_recurrent_ppo_same.json`): distrl's config's numbers: 8 envs x 32
  steps (n_steps 32, 256 per update), 4 epochs, batch_size 64 (distrl's 4 minibatches of 256/4), Adam
  3e-4 constant, gamma 0.99, GAE lambda 0.95, clip 0.2, ent_coef 0, vf_coef 0.5, max_grad_norm 0.5,
  advantages normalized, no observation normalization; one torso of Linear(2, 64) + tanh, then an LSTM
  of 64 shared by actor and critic (shared_lstm=True, enable_critic_lstm=False, lstm_hidden_size=64),
  then linear heads (net_arch=dict(pi=[], vf=[])), ortho_init SB3's default (orthogonal; distrl keeps
  PyTorch's default init). RecurrentPPO puts its LSTM straight after the features extractor, before
  net_arch's MLP; net_arch alone would give observation -> LSTM -> [64] tanh -> heads, the MLP after the
  LSTM. To keep distrl's order (observation -> [64] tanh -> LSTM -> heads) the [64] tanh layer is a
  features extractor (`Torso` here, SB3's BaseFeaturesExtractor API, shared by actor and critic as
  share_features_extractor's default), and net_arch is empty. What still differs:
  * with shared_lstm RecurrentPPO detaches the LSTM's output for the critic (sb3_contrib's
    RecurrentActorCriticPolicy: `latent_vf = latent_pi.detach()`), so the value loss trains only the
    value head; the torso and the LSTM learn from the policy loss alone. distrl's shared torso and core
    get both losses' gradients;
  * value loss: SB3's is vf_coef * mean((V - R)^2); distrl's vf_coef * 0.5 * mean((V - R)^2), half;
  * sequences: distrl trains truncated BPTT over 16-step sequences (rollout.recurrence 16: each env's
    32-step fragment cut in two, each sequence starting from the state stored when it was collected, the
    state zeroed inside it at episode starts), minibatches of whole sequences shuffled (4 per epoch, 4
    sequences of 16 steps each). RecurrentPPO lays the rollout out env-major (each env's 32 steps in a
    row), rotates it by a random offset each epoch, cuts it into contiguous minibatches of 64 steps,
    and splits each minibatch into sequences at episode starts and env changes (up to 32 steps, also
    cut at the minibatch's edges), padded to the longest, each starting from the state stored when it
    was collected: sequences up to 32 steps long, not shuffled beyond the rotation.

JSON: bench/results/sb3_recurrent_ppo.json (rl-zoo's), sb3_recurrent_ppo_same.json (distrl's settings);
`--ours-from bench/results/sb3_recurrent_ppo.json` compares the second row against the first's distrl
runs without re-running them.
"""
from __future__ import annotations

import time

START = time.time()  # the child's clock: before any import, as distrl's cli starts its own

from bench.peers import sb3_runs  # noqa: E402
from bench.peers.sb3_runs import child_args, compare, run_child  # noqa: E402

CONFIG = "configs/ppo_lstm_position_only_cartpole.yaml"
ENV = "popgym.envs.position_only_cartpole:PositionOnlyCartPoleEasy"
N_ENVS = 8
ZOO_TIMESTEPS = 100_000  # rl-zoo's n_timesteps: the horizon of its linear schedules
ZOO = dict(n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8, ent_coef=0.0)
ZOO_SCHEDULES = {"learning_rate": 1e-3, "clip_range": 0.2}  # lin_: from this value to 0 over ZOO_TIMESTEPS
ZOO_POLICY_KWARGS = ("dict(ortho_init=False, activation_fn=nn.ReLU, lstm_hidden_size=64, enable_critic_lstm=True, "
                     "net_arch=dict(pi=[64], vf=[64]))")
SAME = dict(n_steps=32, batch_size=64, n_epochs=4, learning_rate=3e-4, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
            ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, normalize_advantage=True)
SAME_POLICY_KWARGS = ("dict(features_extractor_class=Torso, features_extractor_kwargs=dict(hidden=64), "
                      "lstm_hidden_size=64, n_lstm_layers=1, shared_lstm=True, enable_critic_lstm=False, "
                      "net_arch=dict(pi=[], vf=[]))")
TOTAL_TIMESTEPS = 10**9  # --same-settings: nothing anneals, never reached within the budget
OPTIONS = {"--same-settings": dict(action="store_true", help="distrl's config's hyperparameters and network "
                                                               "instead of rl-zoo's CartPoleNoVel-v1 ones")}


def make_env():
    from popgym.envs.position_only_cartpole import PositionOnlyCartPoleEasy

    return PositionOnlyCartPoleEasy()


def evaluate_recurrent(model, envs, seed: int, normalize_obs=None, action_masks=None) -> float:
    """`sb3_runs.evaluate` for a recurrent policy: mean return of one greedy episode per env, env i seeded
    seed + i, the LSTM state carried from step to step and started at the episodes' start."""
    import numpy as np

    assert action_masks is None, "RecurrentPPO takes no action mask"
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    returns, running = np.zeros(len(envs)), np.ones(len(envs), bool)
    state, starts = None, np.ones(len(envs), bool)
    while running.any():
        seen = np.stack(obs)
        seen = seen if normalize_obs is None else normalize_obs(seen)
        actions, state = model.predict(seen, state=state, episode_start=starts, deterministic=True)
        starts = np.zeros(len(envs), bool)
        for i in np.flatnonzero(running):
            obs[i], reward, term, trunc, _ = envs[i].step(actions[i])
            returns[i] += reward
            running[i] = not (term or trunc)
    return float(returns.mean())


def torso_class():
    """distrl's MLP torso as SB3 features extractor: Linear(obs, hidden) + tanh, before the LSTM."""
    from stable_baselines3.common.preprocessing import get_flattened_obs_dim
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    class Torso(BaseFeaturesExtractor):
        def __init__(self, observation_space, hidden: int = 64):
            super().__init__(observation_space, hidden)  # a Discrete observation comes in one-hot, as distrl's
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(get_flattened_obs_dim(observation_space), hidden),
                                     nn.Tanh())

        def forward(self, obs):
            return self.net(obs)

    return Torso


def child(args) -> None:
    """One SB3 run in this process; prints one JSON line."""
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    from torch import nn  # noqa: F401 - named by the policy kwargs

    torch.set_num_threads(1)
    sb3_runs.evaluate = evaluate_recurrent  # run_child's evaluation: see the module's docstring
    envs = make_vec_env(make_env, n_envs=N_ENVS, seed=args.seed)
    if args.same_settings:
        Torso = torso_class()  # noqa: F841, N806 - named by SAME_POLICY_KWARGS
        model = RecurrentPPO("MlpLstmPolicy", envs, **SAME, policy_kwargs=eval(SAME_POLICY_KWARGS), seed=args.seed,
                             device="cpu", verbose=0)
        run_child(model, make_env, args, START, TOTAL_TIMESTEPS)
        return
    envs = VecNormalize(envs, norm_obs=True, norm_reward=False, gamma=ZOO["gamma"])
    schedules = {k: (lambda v: lambda progress_remaining: progress_remaining * v)(v) for k, v in ZOO_SCHEDULES.items()}
    model = RecurrentPPO("MlpLstmPolicy", envs, **ZOO, **schedules, policy_kwargs=eval(ZOO_POLICY_KWARGS),
                         seed=args.seed, device="cpu", verbose=0)
    run_child(model, make_env, args, START, ZOO_TIMESTEPS, normalize_obs=envs.normalize_obs)


def settings(args) -> dict:
    import sb3_contrib

    common = {"algorithm": "sb3_contrib.RecurrentPPO", "sb3_contrib": sb3_contrib.__version__, "policy": "MlpLstmPolicy",
              "env": ENV, "n_envs": N_ENVS, "evaluation": "predict(state=..., episode_start=..., deterministic=True)"}
    if args.same_settings:
        return {**common, **SAME, "policy_kwargs": SAME_POLICY_KWARGS,
                "Torso": "features extractor: Flatten, Linear(2, 64), Tanh", "total_timesteps": None,
                "settings": "distrl's config (shared LSTM; SB3 detaches it for the critic)"}
    return {**common, **ZOO, **{k: f"lin_{v}" for k, v in ZOO_SCHEDULES.items()}, "policy_kwargs": ZOO_POLICY_KWARGS,
            "VecNormalize": {"norm_obs": True, "norm_reward": False, "gamma": ZOO["gamma"]},
            "total_timesteps": ZOO_TIMESTEPS, "settings": "rl-zoo hyperparams/ppo_lstm.yml CartPoleNoVel-v1"}


if __name__ == "__main__":
    import sys

    if "--child" in sys.argv:
        child(child_args(OPTIONS))
    else:
        out = "sb3_recurrent_ppo_same.json" if "--same-settings" in sys.argv else "sb3_recurrent_ppo.json"
        compare(__spec__.name, CONFIG, OPTIONS, lambda args, cfg: ["--same-settings"] if args.same_settings else [],
                settings, out)
