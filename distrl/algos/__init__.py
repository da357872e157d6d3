"""Algorithm registry: name -> (module, data path, policy). Modules are imported only when used.

The policy is named on its own so that rollout workers and the evaluator build it
without importing the learner's module: the acting halves are numpy and don't
import torch, which saves each such process ~2 s of start-up and its memory.
"""
from __future__ import annotations

import importlib

ALGOS: dict[str, tuple[str, str, str]] = {
    # data path: "replay" (off-policy, sampled), "trajectory" (FIFO, each fragment used once)
    # or "gradients" (A3C: FIFO of worker-computed gradients, applied one at a time in arrival order)
    "apex_dqn": ("distrl.algos.apex_dqn", "replay", "distrl.algos.apex_dqn_acting:DQNPolicy"),
    "sac": ("distrl.algos.sac", "replay", "distrl.algos.sac_acting:SACPolicy"),
    "a2c": ("distrl.algos.a2c", "trajectory", "distrl.algos.actor_critic_acting:ActorCriticPolicy"),
    "a3c": ("distrl.algos.a3c", "gradients", "distrl.algos.a3c:A3CPolicy"),  # computes gradients: torch
    "ppo": ("distrl.algos.ppo", "trajectory", "distrl.algos.actor_critic_acting:ActorCriticPolicy"),
    "impala": ("distrl.algos.impala", "trajectory", "distrl.algos.actor_critic_acting:ActorCriticPolicy"),
}


def make_policy(cfg, spec, worker_index: int, num_workers: int):
    """The policy of `cfg.algo` for worker `worker_index` (-1: the evaluator), from its config section."""
    module, name = ALGOS[cfg.algo][2].split(":")
    policy_cls = getattr(importlib.import_module(module), name)
    seed = cfg.seed + 1000 + worker_index  # the evaluator and each worker differ
    return policy_cls(spec, getattr(cfg, cfg.algo), worker_index, num_workers, seed)


def get_algorithm_class(name: str):
    """The `Algorithm` subclass registered under `name`."""
    return importlib.import_module(ALGOS[name][0]).ALGORITHM


def data_path(name: str) -> str:
    """Where this algorithm's experience goes, known without importing torch."""
    return ALGOS[name][1]
