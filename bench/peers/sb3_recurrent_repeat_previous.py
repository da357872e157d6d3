"""sb3-contrib's RecurrentPPO against distrl's PPO with a GRU on popgym's RepeatPreviousEasy, same criterion,
same clock.

    python -m bench.peers.sb3_recurrent_repeat_previous [--seeds 0 1 2] [--budget-s 300] [--no-ours | --no-sb3]
                                                        [--lock LOCK] [--out PATH]

Per seed, each a fresh process (`bench/peers/sb3_runs.py` runs and times both sides, alternating):
`distrl train configs/ppo_gru_repeat_previous.yaml` (single mode, no TensorBoard) and this module in child
mode, sb3-contrib 2.9's RecurrentPPO (MlpLstmPolicy) on one torch thread. The task: name the suit (one of 4,
the observation a Discrete(4)) of the card dealt 4 steps ago; 51-step episodes; returns normalized to
[-1, 1]. Criterion, from the config: every 5 s of wall time, 20 greedy episodes (one env each, seeded as
distrl's evaluator seeds them, the recurrent state carried: `sb3_recurrent_ppo.evaluate_recurrent`); solved
at the first mean return >= 0.9; unsolved after the budget (300 s), counted as the budget in the medians.

rl-baselines3-zoo has no settings for RepeatPrevious, so SB3 runs distrl's config's numbers: 16 envs
(DummyVecEnv) x 32 steps (n_steps 32, 512 per update), 4 epochs of 4 minibatches (batch_size 128), Adam 1e-3
constant, gamma 0.99, GAE lambda 0.95, clip 0.2, no entropy bonus, vf_coef 0.5, max_grad_norm 0.5,
advantages normalized; the observation one-hot (SB3's preprocessing of a Discrete, distrl's too), one
Linear(4, 64) + tanh torso (`sb3_recurrent_ppo.torso_class`, a features extractor shared by actor and
critic), then one recurrent core of 64 shared by both heads. What differs: RecurrentPPO has an LSTM only
(distrl's config a GRU), detaches the shared core's output for its critic, halves nothing in its value loss
(distrl's is 0.5 x the squared error), and cuts its minibatches into sequences at episode starts and
minibatch edges (up to 32 steps) where distrl trains 16-step sequences from their stored states
(`sb3_recurrent_ppo`'s docstring says more).

JSON: bench/results/sb3_recurrent_repeat_previous.json.
"""
from __future__ import annotations

import time

START = time.time()  # the child's clock: before any import, as distrl's cli starts its own

from bench.peers import sb3_runs  # noqa: E402
from bench.peers.sb3_recurrent_ppo import evaluate_recurrent, torso_class  # noqa: E402
from bench.peers.sb3_runs import child_args, compare, run_child  # noqa: E402

CONFIG = "configs/ppo_gru_repeat_previous.yaml"
ENV = "popgym.envs.repeat_previous:RepeatPreviousEasy"
N_ENVS = 16
SAME = dict(n_steps=32, batch_size=128, n_epochs=4, learning_rate=1e-3, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
            ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, normalize_advantage=True)
POLICY_KWARGS = ("dict(features_extractor_class=Torso, features_extractor_kwargs=dict(hidden=64), "
                 "lstm_hidden_size=64, n_lstm_layers=1, shared_lstm=True, enable_critic_lstm=False, "
                 "net_arch=dict(pi=[], vf=[]))")
TOTAL_TIMESTEPS = 10**9  # nothing anneals: never reached within the budget


def make_env():
    from popgym.envs.repeat_previous import RepeatPreviousEasy

    return RepeatPreviousEasy()


def child(args) -> None:
    """One SB3 run in this process; prints one JSON line."""
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    sb3_runs.evaluate = evaluate_recurrent  # run_child's evaluation carries the recurrent state
    envs = make_vec_env(make_env, n_envs=N_ENVS, seed=args.seed)
    Torso = torso_class()  # noqa: F841, N806 - named by POLICY_KWARGS
    model = RecurrentPPO("MlpLstmPolicy", envs, **SAME, policy_kwargs=eval(POLICY_KWARGS), seed=args.seed,
                         device="cpu", verbose=0)
    run_child(model, make_env, args, START, TOTAL_TIMESTEPS)


def settings(args) -> dict:
    import sb3_contrib

    return {"algorithm": "sb3_contrib.RecurrentPPO", "sb3_contrib": sb3_contrib.__version__, "policy": "MlpLstmPolicy",
            "env": ENV, "n_envs": N_ENVS, "evaluation": "predict(state=..., episode_start=..., deterministic=True)",
            **SAME, "policy_kwargs": POLICY_KWARGS, "Torso": "features extractor: Flatten, Linear(4, 64), Tanh",
            "total_timesteps": None, "settings": "distrl's config (an LSTM for its GRU; SB3 detaches it for the critic)"}


if __name__ == "__main__":
    import sys

    if "--child" in sys.argv:
        child(child_args({}))
    else:
        compare(__spec__.name, CONFIG, {}, lambda args, cfg: [], settings, "sb3_recurrent_repeat_previous.json")
