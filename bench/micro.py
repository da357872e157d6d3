"""Hot-path microbenchmarks on one torch thread: a worker's act() call and a SAC update.

    python -m bench.micro [--reps 7]

act(): the numpy acting path the workers use against acting through the learner's
torch net (forward, sample, log-prob, back to numpy), for the shipped LunarLander configs'
policies and 8 envs. SAC update: one `SACLearner.update` on a random batch of the
LunarLanderContinuous config (64x64, batch 256), by the numpy path the CPU learner
runs and by the autograd path (GPUs, and the reference the tests check against).
Medians of `--reps` timings.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from bench.common import ROOT, hardware, write_json
from distrl.registry import make_policy
from distrl.config import load_config
from distrl.roles.factory import build_algorithm


def median_us(fn, calls: int, reps: int) -> float:
    for _ in range(calls // 10):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return float(np.median(times))


def torch_act(learner, rng: np.random.Generator, obs: np.ndarray) -> None:
    """Acting through the learner's torch net: forward, sample, log-prob, back to numpy."""
    with torch.inference_mode():
        x = torch.as_tensor(obs)
        if hasattr(learner, "net"):  # actor-critic, Discrete actions
            dist, value = learner.net(x)
            a = torch.multinomial(dist.logp_all.exp(), 1).squeeze(-1)
            dist.log_prob(a).numpy(), value.numpy(), a.numpy()
        else:  # SAC
            mean, log_std = learner.actor(x)
            np.tanh(mean.numpy() + np.exp(log_std.numpy()) * rng.standard_normal(mean.shape))


def _config(name: str):
    return load_config(os.path.join(ROOT, "configs", name))


def act_costs(reps: int) -> dict:
    out = {}
    for name in ("ppo_lunarlander.yaml", "impala_lunarlander.yaml", "sac_lunarlander_continuous.yaml"):
        cfg = _config(name)
        algo = build_algorithm(cfg)
        policy, learner = make_policy(algo.cfg, algo.spec, 0, 1), algo.make_learner("cpu")
        policy.set_weights(learner.get_weights(), 0)
        policy.env_steps = 10**9  # SAC: past its uniform-random warm-up
        obs = np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32)
        numpy_us = median_us(lambda: policy.act(obs, True), 2000, reps)
        torch_us = median_us(lambda: torch_act(learner, policy.rng, obs), 2000, reps)
        out[name] = {"numpy_act_us": round(numpy_us, 1), "torch_act_us": round(torch_us, 1),
                     "ratio": round(torch_us / numpy_us, 2)}
        print(name, out[name])
    return out


def sac_update_ms(reps: int) -> dict:
    """One SAC update, the numpy path (CPU default) and the autograd path, interleaved in one process."""
    cfg = _config("sac_lunarlander_continuous.yaml")
    algo = build_algorithm(cfg)
    fast, ref = algo.make_learner("cpu"), algo.make_learner("cpu")
    ref.numpy = False
    rng = np.random.default_rng(0)
    b = cfg.learner.batch_size
    batch = {"obs": rng.normal(size=(b, 8)).astype(np.float32), "next_obs": rng.normal(size=(b, 8)).astype(np.float32),
             "actions": rng.uniform(-1, 1, (b, 2)).astype(np.float32), "rewards": rng.normal(size=b).astype(np.float32),
             "discounts": np.full(b, 0.97, np.float32)}
    numpy_ms, autograd_ms = [], []
    for _ in range(reps):  # alternate, so a slow minute hits both paths alike
        numpy_ms.append(median_us(lambda: fast.update(batch), 200, 1) / 1000.0)
        autograd_ms.append(median_us(lambda: ref.update(batch), 200, 1) / 1000.0)
    out = {"numpy_ms": round(float(np.median(numpy_ms)), 2), "autograd_ms": round(float(np.median(autograd_ms)), 2)}
    out["ratio"] = round(out["autograd_ms"] / out["numpy_ms"], 2)
    print("sac update", out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {"hardware": hardware(), "act": act_costs(args.reps), "sac_update": sac_update_ms(args.reps)}
    write_json(os.path.join(ROOT, "bench", "results", "micro.json"), results)


if __name__ == "__main__":
    main()
