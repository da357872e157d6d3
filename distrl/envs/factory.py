"""Build gymnasium envs by id, turning every failure into one clear `EnvError`.

`env.id` is a registered gymnasium id (`CartPole-v1`), a registered id in a
module that registers it on import (`package.module:EnvName-v0`, gymnasium's
convention), or an env class in a module (`popgym.envs.position_only_cartpole:PositionOnlyCartPoleEasy`).
Discrete and MultiDiscrete observations are one-hot encoded into a float32 Box,
so every algorithm sees flat vectors.
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from distrl.core import EnvSpec


class EnvError(ValueError):
    """The configured environment can't be built (unknown id, bad kwargs, missing extra)."""


def import_module_of(env_id: str) -> tuple[Any, str]:
    """(imported module, name) of a `module:name` id, or EnvError naming what is wrong with it."""
    module, _, name = env_id.partition(":")
    if not module or not name:
        raise EnvError(f"config key 'env.id': {env_id!r} must look like module:Name")
    try:
        return importlib.import_module(module), name
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a relative or empty name (TypeError, ValueError),
        # a missing module, or whatever the module's own code raises on import: the id names the wrong thing
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise EnvError(f"config key 'env.id': cannot import {module!r} for {env_id!r}: {reason}") from None


def _constructor(env_id: str) -> Callable[..., gym.Env]:
    """What builds `env_id` from kwargs, or EnvError naming what is wrong with the id."""
    if ":" not in env_id:
        if env_id in gym.envs.registry:
            return lambda **kw: gym.make(env_id, **kw)
        close = [k for k in gym.envs.registry if k.split("-")[0].lower() == env_id.split("-")[0].lower()]
        hint = f" (did you mean {', '.join(sorted(close)[:3])}?)" if close else ""
        raise EnvError(f"config key 'env.id': unknown gymnasium environment {env_id!r}{hint}")
    mod, name = import_module_of(env_id)
    if name in gym.envs.registry:
        return lambda **kw: gym.make(name, **kw)
    try:
        cls = getattr(mod, name, None)
    except Exception:  # noqa: BLE001 - a module-level __getattr__ may raise anything for a name it lacks
        cls = None
    if isinstance(cls, type) and issubclass(cls, gym.Env):
        return cls
    raise EnvError(f"config key 'env.id': {mod.__name__!r} has no gymnasium env class or registered id {name!r}")


def _flat_observations(env: gym.Env) -> gym.Env:
    if isinstance(env.observation_space, (spaces.Discrete, spaces.MultiDiscrete)):
        from gymnasium.wrappers import DtypeObservation, FlattenObservation

        return DtypeObservation(FlattenObservation(env), np.float32)
    return env


def make_env(env_id: str, kwargs: dict[str, Any] | None = None) -> gym.Env:
    make = _constructor(env_id)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gymnasium deprecation chatter is not the user's problem
            return _flat_observations(make(**(kwargs or {})))
    except gym.error.DependencyNotInstalled as e:
        raise EnvError(f"environment {env_id!r} needs a missing dependency: {e}") from None
    except Exception as e:  # noqa: BLE001 - any constructor failure is the config's env.kwargs or env.id
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise EnvError(f"config key 'env.kwargs': {env_id} could not be built with {kwargs or {}}: {reason}") from None


def check_env(env_id: str, kwargs: dict[str, Any] | None = None) -> EnvSpec:
    """Build the env, reset it and take one step: an env whose kwargs fail only there is caught before
    any worker starts. Its spec, or EnvError."""
    env = make_env(env_id, kwargs)
    try:
        env.reset(seed=0)
        env.step(env.action_space.sample())
        return EnvSpec(env.observation_space, env.action_space)
    except Exception as e:  # noqa: BLE001 - whatever the env raises, its config made it
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise EnvError(f"config key 'env.kwargs': {env_id} with {kwargs or {}} fails on reset or step: {reason}") from None
    finally:
        env.close()


def env_spec(env_id: str, kwargs: dict[str, Any] | None = None) -> EnvSpec:
    env = make_env(env_id, kwargs)
    try:
        return EnvSpec(env.observation_space, env.action_space)
    finally:
        env.close()
