"""Build gymnasium envs by id, turning every failure into one clear `EnvError`."""
from __future__ import annotations

import importlib
import warnings
from typing import Any

import gymnasium as gym

from distrl.core import EnvSpec


class EnvError(ValueError):
    """The configured environment can't be built (unknown id, bad kwargs, missing extra)."""


def _registered(env_id: str) -> bool:
    """True if known; 'package.module:EnvName-v0' ids import their module first (gymnasium's convention)."""
    if ":" in env_id:
        module, name = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise EnvError(f"config key 'env.id': cannot import {module!r} for {env_id!r}: {e}") from None
        return name in gym.envs.registry
    return env_id in gym.envs.registry


def make_env(env_id: str, kwargs: dict[str, Any] | None = None) -> gym.Env:
    if not _registered(env_id):
        close = [k for k in gym.envs.registry if k.split("-")[0].lower() == env_id.split("-")[0].lower()]
        hint = f" (did you mean {', '.join(sorted(close)[:3])}?)" if close else ""
        raise EnvError(f"config key 'env.id': unknown gymnasium environment {env_id!r}{hint}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gymnasium deprecation chatter is not the user's problem
            return gym.make(env_id, **(kwargs or {}))
    except TypeError as e:
        raise EnvError(f"config key 'env.kwargs': {env_id} rejected them: {e}") from None
    except gym.error.DependencyNotInstalled as e:
        raise EnvError(f"environment {env_id!r} needs a missing dependency: {e}") from None


def env_spec(env_id: str, kwargs: dict[str, Any] | None = None) -> EnvSpec:
    env = make_env(env_id, kwargs)
    try:
        return EnvSpec(env.observation_space, env.action_space)
    finally:
        env.close()
