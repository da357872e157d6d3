"""Hot-path microbenchmarks per algorithm family: a worker's act() call and one learner update.

On one torch thread, as every role runs.

    python -m bench.micro [--reps 7] [--families q_learning actor_critic ...] [--set KEY=VALUE ...]

Every network is a torch module built by the torso factory, the same for the learner, the workers and
the evaluator, so there is one acting path to time. For each family, from one shipped config:

- act: one `policy.act(obs, explore=True)` on a worker's `env.num_envs` observations (real ones, from
  the config's envs): the forward pass through the policy's network under `torch.inference_mode()`,
  the exploration on its outputs and the conversion back to numpy (a recurrent policy also advances
  its envs' states); SAC past its uniform-random warm-up, so its network runs.
- update: one `learner.update(batch)` on CPU, the batch taken from the config's own store (replay,
  sequence replay or the on-policy FIFO) after a real rollout filled it; an actor-critic's update is
  its whole step (PPO: every epoch and minibatch).

Medians of `--reps` timings of many calls each, after a warm-up.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from bench.common import ROOT, hardware, write_json
from distrl.config import load_config
from distrl.core import TrainStats
from distrl.replay.fifo import FragmentQueue
from distrl.roles.factory import make_algorithm, make_rollout, make_vector_env, policy_seed
from distrl.roles.learning import learn_block
from distrl.runtime.pacing import experience_spec, make_experience

FAMILIES = {  # family -> a shipped config of it
    "q_learning": "apex_dqn_cartpole.yaml",
    "recurrent_q_learning": "r2d2_position_only_cartpole.yaml",
    "multi_agent": "dhc_mapf_8x8.yaml",
    "actor_critic": "ppo_lunarlander.yaml",
    "vtrace": "impala_lunarlander.yaml",
    "sac": "sac_lunarlander_continuous.yaml",
    "sac_mujoco": "sac_halfcheetah.yaml",  # 256x256 networks: the update is the whole run
    "pixels": "apex_dqn_atari_breakout.yaml",  # the Nature CNN on 84x84x4 uint8 frames
    "minatar": "apex_dqn_minatar_breakout.yaml",  # the MinAtar CNN on 10x10x4 frames
}


def median_us(fn, calls: int, reps: int) -> float:
    for _ in range(max(1, calls // 10)):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return float(np.median(times))


def filled_block(cfg, algo, learner):
    """One learner batch from the config's own store, filled by a real rollout of a worker's policy."""
    policy = algo.make_policy(0, 1, policy_seed(cfg.seed, 0))
    policy.set_weights(learner.get_weights(), 0)
    policy.observe_steps(10**9)  # past any warm-up: the network acts
    experience, rollout = make_experience(experience_spec(cfg)), make_rollout(cfg, policy, cfg.seed, 0)
    replayed = not isinstance(experience.store, FragmentQueue)
    for _ in range(1000):
        frag = rollout.sample()
        experience.add(frag.data, frag.priorities)
        # A replay samples with replacement: hold at least a batch of distinct items first.
        if not replayed or len(experience) >= cfg.learner.batch_size:
            block = experience.next_block(1)
            if block is not None:
                return block
    raise RuntimeError(f"{cfg.algo}: the store never filled one batch")


def family_costs(config: str, reps: int, overrides: list[str]) -> dict:
    cfg = load_config(os.path.join(ROOT, "configs", config), overrides)
    algo = make_algorithm(cfg)
    learner = algo.make_learner("cpu")
    policy = algo.make_policy(0, 1, policy_seed(cfg.seed, 0))
    policy.set_weights(learner.get_weights(), 0)
    policy.observe_steps(10**9)  # SAC: past its uniform-random warm-up
    envs = make_vector_env(cfg.env.id, cfg.env.num_envs, cfg.seed, cfg.env.kwargs, type(algo).multi_agent,
                           wrappers=cfg.env.wrappers, preset=cfg.env.preset)
    obs = envs.obs
    envs.close()
    act_us = median_us(lambda: policy.act(obs, True), 500, reps)
    block = filled_block(cfg, algo, learner)
    update_ms = median_us(lambda: learn_block(learner, block, TrainStats()), 20, reps) / 1000.0
    out = {"algo": cfg.algo, "config": config, "num_envs": cfg.env.num_envs, "act_us": round(act_us, 1),
           "act_us_per_env": round(act_us / cfg.env.num_envs, 2), "batch_size": cfg.learner.batch_size,
           "update_ms": round(update_ms, 2)}
    print(out, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "micro.json"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every family (model.torso=impala, say)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {"hardware": hardware(), "overrides": args.overrides,
               "families": {f: family_costs(FAMILIES[f], args.reps, args.overrides) for f in args.families}}
    write_json(args.out, results)


if __name__ == "__main__":
    main()
