"""Building a role's pieces from a config: the algorithm, a policy, the learner's device."""
from __future__ import annotations

from distrl.core import EnvSpec
from distrl.envs import VectorEnv, env_spec
from distrl.registry import algorithm_class, make_policy, multi_agent
from distrl.threads import one_compute_thread


def spec_of(cfg) -> EnvSpec:
    """What the configured env gives one agent: the spaces a policy and a learner are built for."""
    if not multi_agent(cfg.algo):
        return env_spec(cfg.env.id, cfg.env.kwargs)
    from distrl.envs.multiagent import make_multiagent_env

    env = make_multiagent_env(cfg.env.id, cfg.env.kwargs)
    try:
        return EnvSpec(env.observation_space, env.action_space)
    finally:
        env.close()


def make_vector_env(env_id: str, num_envs: int, seed: int, kwargs: dict | None, is_multi_agent: bool):
    """The vector of envs a worker or the evaluator steps (multi-agent ones for multi-agent algorithms)."""
    if is_multi_agent:
        from distrl.envs.multiagent_vector import MultiAgentVectorEnv

        return MultiAgentVectorEnv(env_id, num_envs, seed, kwargs)
    return VectorEnv(env_id, num_envs, seed, kwargs)


def make_rollout(cfg, policy, seed: int, worker_index: int):
    """A worker's rollout job: its policy stepping `env.num_envs` envs."""
    from distrl.roles.rollout import Rollout

    envs = make_vector_env(cfg.env.id, cfg.env.num_envs, seed, cfg.env.kwargs, multi_agent(cfg.algo))
    return Rollout(policy, envs, cfg.rollout.fragment_length, worker_index)


def build_algorithm(cfg):
    """The configured `Algorithm` (imports its learner module, and so torch)."""
    return algorithm_class(cfg.algo)(cfg, spec_of(cfg))


def acting_policy(cfg, worker_index: int, num_workers: int):
    """The policy alone, without the learner's module: for most algorithms the process never loads torch."""
    policy = make_policy(cfg, spec_of(cfg), worker_index, num_workers)
    one_compute_thread()  # and torch's, if the policy loaded it (A3C computes gradients with it)
    return policy


def trace_settings(cfg) -> tuple[bool, int]:
    """(whether to record a trace, events each process keeps), as every role's tracer takes them."""
    return cfg.log.trace, cfg.log.trace_events


def resolve_device(device: str) -> str:
    """'auto' -> cuda when a GPU is visible, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
