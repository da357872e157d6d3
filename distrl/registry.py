"""The algorithm table: name -> where its learner and its policy live, and its data path.

Module paths are strings and are imported only when used, so this module sits
at the bottom of the package (the config validates names against it without
loading torch). The policy is named on its own: rollout workers and the
evaluator build it without importing the learner's module, and for every
algorithm but A3C that keeps torch out of their processes.
"""
from __future__ import annotations

import importlib
from typing import NamedTuple


class Entry(NamedTuple):
    learner_module: str
    """Module holding the `Algorithm` subclass as `ALGORITHM` (torch)."""
    data_path: str
    """"replay" (off-policy transitions, sampled), "sequence" (off-policy sequences in shared chunks,
    sampled), "trajectory" (FIFO, each fragment used once) or "gradients" (A3C: a FIFO of
    worker-computed gradients, applied in arrival order)."""
    policy: str
    """"module:Class" of the acting half."""
    multi_agent: bool = False
    """Acts for every agent of a `distrl.envs.multiagent.MultiAgentEnv` at once."""
    gradient_workers: bool = False
    """Its learner can share each step's gradient with gradient workers (`distrl.algos.sharding`)."""
    central_inference: bool = True
    """Its policy acts through `Policy.forward`, so an InferenceServer can run it for every worker."""


ALGOS: dict[str, Entry] = {
    "apex_dqn": Entry("distrl.algos.apex_dqn", "replay", "distrl.algos.apex_dqn_acting:DQNPolicy",
                      gradient_workers=True),
    "sac": Entry("distrl.algos.sac", "replay", "distrl.algos.sac_acting:SACPolicy"),
    "r2d2": Entry("distrl.algos.r2d2", "sequence", "distrl.algos.r2d2_acting:R2D2Policy"),
    "dhc": Entry("distrl.algos.dhc", "sequence", "distrl.algos.dhc_acting:DHCPolicy", multi_agent=True,
                 central_inference=False),
    "a2c": Entry("distrl.algos.a2c", "trajectory", "distrl.algos.actor_critic_acting:ActorCriticPolicy"),
    # A3C's workers compute gradients with their own copy of the weights: they act with it too.
    "a3c": Entry("distrl.algos.a3c", "gradients", "distrl.algos.a3c:A3CPolicy", central_inference=False),
    "ppo": Entry("distrl.algos.ppo", "trajectory", "distrl.algos.actor_critic_acting:ActorCriticPolicy",
                 gradient_workers=True),
    "impala": Entry("distrl.algos.impala", "trajectory", "distrl.algos.actor_critic_acting:ActorCriticPolicy",
                    gradient_workers=True),
}


def algorithm_class(name: str):
    """The `Algorithm` subclass registered under `name` (imports its learner module)."""
    return importlib.import_module(ALGOS[name].learner_module).ALGORITHM


def policy_class(name: str):
    """The acting class of `name` (imports only the acting module)."""
    module, cls = ALGOS[name].policy.split(":")
    return getattr(importlib.import_module(module), cls)


def make_policy(cfg, spec, worker_index: int, num_workers: int):
    """The policy of `cfg.algo` for worker `worker_index` (-1: the evaluator), from its config section."""
    seed = cfg.seed + 1000 + worker_index  # the evaluator and each worker differ
    extra = {"sequence": cfg.sequence} if data_path(cfg.algo) == "sequence" else {}  # how to cut sequences
    return policy_class(cfg.algo)(spec, getattr(cfg, cfg.algo), worker_index, num_workers, seed, **extra)


def data_path(name: str) -> str:
    """Where this algorithm's experience goes, known without importing torch."""
    return ALGOS[name].data_path


def takes_gradient_workers(name: str) -> bool:
    return ALGOS[name].gradient_workers


def takes_central_inference(name: str) -> bool:
    return ALGOS[name].central_inference


def multi_agent(name: str) -> bool:
    return ALGOS[name].multi_agent


def on_policy(name: str) -> bool:
    """Each piece of data is used once, by the newest weights (trajectories and gradients)."""
    return ALGOS[name].data_path in ("trajectory", "gradients")
