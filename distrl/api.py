"""The Python API: `train(config) -> summary`, `resume(run_dir)`, `evaluate(run_dir)`; usable from a notebook."""
from __future__ import annotations

import os
import time
from typing import Any

from distrl.config import Config, ConfigError, apply_overrides, from_dict, load_config, to_dict


def validate(cfg: Config) -> None:
    """Everything about a config that can be checked before a run dir exists."""
    from distrl.envs import EnvError, env_spec
    from distrl.registry import algorithm_class

    try:
        spec = env_spec(cfg.env.id, cfg.env.kwargs)
    except EnvError as e:
        raise ConfigError(str(e)) from None
    algo = algorithm_class(cfg.algo)
    problem = algo.check_spec(spec)
    if problem:
        raise ConfigError(f"config key 'algo': {problem} ({cfg.env.id})")
    if cfg.mode not in algo.modes:
        raise ConfigError(f"config key 'mode': {cfg.algo} does not support mode {cfg.mode!r} "
                          f"(supported: {', '.join(algo.modes)})")
    if cfg.device != "auto" and not (cfg.device == "cpu" or cfg.device.startswith("cuda")):
        raise ConfigError(f"config key 'device': expected auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    if cfg.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"config key 'device': {cfg.device} requested but no CUDA device is visible")
    if cfg.replay.min_size > cfg.replay.capacity:
        raise ConfigError("config key 'replay.min_size': larger than replay.capacity, learning would never start")


def default_run_dir(cfg: Config) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{cfg.algo}_{cfg.env.id}_{cfg.mode}_{stamp}")


def resolve_config(config: Config | dict | str | None, overrides: list[str] | None = None) -> Config:
    if isinstance(config, Config):
        return from_dict(apply_overrides(to_dict(config), overrides or [])) if overrides else config
    if isinstance(config, dict):
        return from_dict(apply_overrides(dict(config), overrides or []))
    return load_config(config, overrides)


def train(config: Config | dict | str | None = None, *, overrides: list[str] | None = None,
          run_dir: str | None = None, address: str | None = None,
          start_time: float | None = None) -> dict[str, Any]:
    """Train to a stop condition and return the run summary (also in run_dir/summary.json).

    `config` is a Config, a dict shaped like the YAML, or a YAML path; `overrides`
    are `section.key=value` strings. Raises ConfigError on bad input before
    anything is written.
    """
    start = start_time if start_time is not None else time.time()
    cfg = resolve_config(config, overrides)
    validate(cfg)
    run_dir = run_dir or default_run_dir(cfg)
    if os.path.exists(os.path.join(run_dir, "config.yaml")):
        raise ConfigError(f"run dir {run_dir} already holds a run; choose another --run-dir")
    from distrl.runtime.launch import run_training

    return run_training(cfg, run_dir, start, address)


def _run_config(run_dir: str, overrides: list[str] | None = None) -> Config:
    if not os.path.isdir(run_dir):
        raise ConfigError(f"run dir not found: {run_dir}")
    cfg_path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(cfg_path):
        raise ConfigError(f"{run_dir} is not a distrl run dir (no config.yaml)")
    return load_config(cfg_path, overrides)


def resume(run_dir: str, *, overrides: list[str] | None = None, address: str | None = None) -> dict[str, Any]:
    """Continue `run_dir` from its newest complete checkpoint; returns the final summary.

    `overrides` may change e.g. stop.* (the budget counts the time already spent).
    Raises ConfigError / CheckpointError on a missing run dir or a bad checkpoint.
    """
    from distrl.checkpoint.run import load_latest
    from distrl.runtime.launch import resume_training

    cfg = _run_config(run_dir, overrides)
    validate(cfg)
    path, state = load_latest(run_dir)
    return resume_training(cfg, run_dir, path, state, address)


def evaluate(run_dir: str, episodes: int = 20, seed: int = 12345) -> dict[str, Any]:
    """Greedy episodes with a run's best checkpoint: {"env", "returns", "mean", "std", "version"}.

    Raises ConfigError / CheckpointError on a missing run dir or a bad checkpoint.
    """
    import numpy as np

    from distrl.checkpoint import load_weights
    from distrl.roles.evaluation import play_greedy
    from distrl.roles.factory import acting_policy

    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    cfg = _run_config(run_dir)
    weights, meta = load_weights(os.path.join(run_dir, "checkpoints", "best.safetensors"))
    policy = acting_policy(cfg, -1, 1)
    policy.set_weights(weights, int(meta.get("version", 0)))
    returns = play_greedy(policy, cfg.env.id, episodes, seed, cfg.env.kwargs)
    return {"env": cfg.env.id, "returns": returns.tolist(), "mean": float(np.mean(returns)),
            "std": float(np.std(returns)), "version": meta.get("version")}
