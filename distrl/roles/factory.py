"""Building a role's pieces from a config: the algorithm, a policy, the learner's device."""
from __future__ import annotations

from distrl.envs import env_spec
from distrl.registry import algorithm_class, make_policy
from distrl.threads import one_compute_thread


def build_algorithm(cfg):
    """The configured `Algorithm` (imports its learner module, and so torch)."""
    return algorithm_class(cfg.algo)(cfg, env_spec(cfg.env.id, cfg.env.kwargs))


def acting_policy(cfg, worker_index: int, num_workers: int):
    """The policy alone, without the learner's module: for most algorithms the process never loads torch."""
    policy = make_policy(cfg, env_spec(cfg.env.id, cfg.env.kwargs), worker_index, num_workers)
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
