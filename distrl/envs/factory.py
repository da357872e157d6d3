"""Build gymnasium envs by id, turning every failure into one clear `EnvError`."""
from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym

from distrl.core import EnvSpec


class EnvError(ValueError):
    """The configured environment can't be built (unknown id, bad kwargs, missing extra)."""


def make_env(env_id: str, kwargs: dict[str, Any] | None = None) -> gym.Env:
    if env_id not in gym.envs.registry:
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
