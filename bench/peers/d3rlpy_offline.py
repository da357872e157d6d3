"""d3rlpy on a distrl-recorded Minari dataset: the peer side of `python -m bench.offline`.

Runs in its own venv (d3rlpy pins gymnasium 1.0; `bash bench/peers/setup_d3rlpy.sh` makes it):

    bench/peers/.venv-d3rlpy/bin/python bench/peers/d3rlpy_offline.py ALGO DATASET_DIR ENV_ID TARGET SEED BUDGET_S

ALGO: bc | cql (Discrete or Box, by the dataset's action space). The dataset is read with h5py from
Minari's files (d3rlpy's own Minari loader misaligns observations after the first episode). Every
`--eval-every` updates, 20 greedy episodes score the policy; the run ends at the first mean >= TARGET or
after BUDGET_S seconds. Prints one JSON line: time to solve from this process's start (imports included,
as distrl's is), best mean return, updates.
"""
from __future__ import annotations

import time

START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402

import d3rlpy  # noqa: E402
import gymnasium as gym  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def load(data_dir: str):
    meta = json.load(open(f"{data_dir}/metadata.json"))
    cols = [[] for _ in range(5)]
    with h5py.File(f"{data_dir}/main_data.hdf5", "r") as f:
        for i in range(meta["total_episodes"]):
            g = f[f"episode_{i}"]
            term = g["terminations"][:].astype(bool)
            last = np.zeros(len(term), bool)
            last[-1] = True
            timeout = (g["truncations"][:].astype(bool) | last) & ~term  # every episode ends, never both flags
            for c, x in zip(cols, (g["observations"][:-1], g["actions"][:], g["rewards"][:], term, timeout)):
                c.append(x)
    obs, act, rew, term, timeout = (np.concatenate(c) for c in cols)
    return json.loads(meta["action_space"]), obs, act, rew.astype(np.float32), term.astype(np.float32), timeout.astype(np.float32)


def make(algo: str, space: dict, seed: int):
    """d3rlpy's algorithm with distrl's shipped config's sizes and rates (64x64 networks), else its defaults."""
    d3rlpy.seed(seed)
    encoder = d3rlpy.models.encoders.VectorEncoderFactory([64, 64])
    discrete = space["type"] == "Discrete"
    if discrete and algo == "bc":
        return d3rlpy.algos.DiscreteBCConfig(batch_size=256, learning_rate=1e-3, encoder_factory=encoder)
    if discrete:
        return d3rlpy.algos.DiscreteCQLConfig(batch_size=256, learning_rate=1e-3, alpha=1.0, target_update_interval=100,
                                              gamma=0.99, encoder_factory=encoder)  # 1-step targets: d3rlpy has no n-step
    scaler = d3rlpy.preprocessing.MinMaxActionScaler(minimum=np.array(space["low"]), maximum=np.array(space["high"]))
    if algo == "bc":
        return d3rlpy.algos.BCConfig(batch_size=128, learning_rate=1e-3, encoder_factory=encoder, action_scaler=scaler)
    return d3rlpy.algos.CQLConfig(batch_size=128, actor_learning_rate=1e-3, critic_learning_rate=1e-3,
                                  temp_learning_rate=1e-3, alpha_learning_rate=0.0, conservative_weight=5.0,
                                  n_action_samples=4, actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                                  action_scaler=scaler)


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("algo", "dataset", "env_id"):
        ap.add_argument(name)
    ap.add_argument("target", type=float)
    ap.add_argument("seed", type=int)
    ap.add_argument("budget_s", type=float)
    ap.add_argument("--eval-every", type=int, default=500)
    args = ap.parse_args()
    torch.set_num_threads(1)
    space, obs, act, rew, term, timeout = load(f"{args.dataset}/data")
    kind = d3rlpy.ActionSpace.DISCRETE if space["type"] == "Discrete" else d3rlpy.ActionSpace.CONTINUOUS
    size = space["n"] if space["type"] == "Discrete" else len(space["shape"]) and space["shape"][0]
    data = d3rlpy.dataset.MDPDataset(obs, act, rew, term, timeout, action_space=kind, action_size=size)
    learner = make(args.algo, space, args.seed).create(device="cpu:0")
    env = gym.make(args.env_id)
    best, updates, solved_at = -np.inf, 0, None
    while time.time() - START < args.budget_s and solved_at is None:
        learner.fit(data, n_steps=args.eval_every, n_steps_per_epoch=args.eval_every, show_progress=False,
                    logger_adapter=d3rlpy.logging.NoopAdapterFactory())
        updates += args.eval_every
        score = d3rlpy.metrics.evaluate_qlearning_with_environment(learner, env, n_trials=20)
        best = max(best, score)
        if score >= args.target:
            solved_at = time.time() - START
    print(json.dumps({"peer": "d3rlpy", "algo": args.algo, "seed": args.seed, "solved": solved_at is not None,
                      "time_to_solve_s": solved_at, "best_eval_return": float(best), "updates": updates,
                      "wall_s": time.time() - START, "d3rlpy": d3rlpy.__version__}))


if __name__ == "__main__":
    main()
