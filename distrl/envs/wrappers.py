"""`env.wrappers`: gymnasium wrappers from the config, checked, and applied in order.

Each item is a wrapper's name in `gymnasium.wrappers` (`FrameStackObservation`) or `package.module:Class`
(a `gymnasium.Wrapper` subclass), given bare (`TimeLimit`) or as a one-name mapping to its keyword
arguments (`{FrameStackObservation: {stack_size: 4}}`); `train_only: true` beside the name applies it to
the rollout workers' envs only (the evaluator scores envs without it). Every mistake is one `EnvError`
naming `env.wrappers[i]`.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import gymnasium.wrappers

from distrl.envs.errors import EnvError, one_line

TRAIN_ONLY = "train_only"


@dataclass(frozen=True)
class WrapperSpec:
    """One wrapper to apply: its class and keyword arguments, and the config key that asked for it."""

    cls: type
    kwargs: dict = field(default_factory=dict)
    train_only: bool = False
    key: str = "env.wrappers"

    def apply(self, env: gym.Env) -> gym.Env:
        try:
            return self.cls(env, **self.kwargs)
        except Exception as e:  # noqa: BLE001 - whatever the wrapper raises, its config entry made it
            raise EnvError(f"config key '{self.key}': {self.cls.__name__}({_kwargs_text(self.kwargs)}) "
                           f"fails on this env: {one_line(e)}") from None


def _kwargs_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _gymnasium_wrapper(name: str, key: str) -> type:
    cls = getattr(gymnasium.wrappers, name, None) if name in gymnasium.wrappers.__all__ else None
    if isinstance(cls, type) and issubclass(cls, gym.Wrapper):
        return cls
    names = [n for n in gymnasium.wrappers.__all__ if n != "vector"]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else " (a name from gymnasium.wrappers, or module:Class)"
    raise EnvError(f"config key '{key}': unknown gymnasium wrapper {name!r}{hint}")


def _imported_wrapper(target: str, key: str) -> type:
    module, _, name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name, None) if module and name else None
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a missing module, or whatever its import raises
        raise EnvError(f"config key '{key}': cannot import {module!r} for {target!r}: {one_line(e)}") from None
    if not (isinstance(cls, type) and issubclass(cls, gym.Wrapper)):
        raise EnvError(f"config key '{key}': {target!r} is not a gymnasium.Wrapper class (expected module:Class)")
    return cls


def _check_kwargs(cls: type, kwargs: dict, key: str) -> None:
    """Keyword arguments the wrapper does not take (or required ones missing), before any env is built."""
    try:
        inspect.signature(cls).bind(None, **kwargs)
    except TypeError as e:
        params = [p for p in inspect.signature(cls).parameters if p not in ("env", "self")]
        raise EnvError(f"config key '{key}': {cls.__name__}: {e} (it takes: {', '.join(params)})") from None
    except ValueError:  # a signature inspect cannot read (a C extension): the wrapper itself will say
        pass


def _split_item(item: Any, key: str) -> tuple[str, dict, bool]:
    """(target, kwargs, train_only) of one `env.wrappers` item."""
    if isinstance(item, str):
        return item, {}, False
    if not isinstance(item, dict):
        raise EnvError(f"config key '{key}': expected a wrapper name or {{Name: {{kwargs}}}}, got {item!r}")
    train_only = item.get(TRAIN_ONLY, False)
    if not isinstance(train_only, bool):
        raise EnvError(f"config key '{key}.{TRAIN_ONLY}': expected true or false, got {train_only!r}")
    names = [k for k in item if k != TRAIN_ONLY]
    if len(names) != 1 or not isinstance(names[0], str):
        raise EnvError(f"config key '{key}': expected exactly one wrapper name (and optionally "
                       f"{TRAIN_ONLY}), got {sorted(map(str, names))}")
    kwargs = item[names[0]]
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise EnvError(f"config key '{key}': the kwargs of {names[0]} must be a mapping, got {kwargs!r}")
    return names[0], kwargs, train_only


def parse_wrappers(items: list | None) -> list[WrapperSpec]:
    """The wrappers an `env.wrappers` list asks for, each resolved to its class and its kwargs checked."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise EnvError(f"config key 'env.wrappers': expected a list, got {items!r}")
    specs = []
    for i, item in enumerate(items):
        key = f"env.wrappers[{i}]"
        target, kwargs, train_only = _split_item(item, key)
        cls = _imported_wrapper(target, key) if ":" in target else _gymnasium_wrapper(target, key)
        _check_kwargs(cls, kwargs, key)
        specs.append(WrapperSpec(cls, dict(kwargs), train_only, key))
    return specs


def apply_wrappers(env: gym.Env, specs: list[WrapperSpec], training: bool) -> gym.Env:
    """`env` inside each wrapper in order; train-only ones only for training envs."""
    for spec in specs:
        if training or not spec.train_only:
            env = spec.apply(env)
    return env


def frame_stack_of(env: gym.Env) -> int:
    """How many frames the env's observations stack on their first axis: a FrameStackObservation that no
    later wrapper changed the observations of; 0 if there is none."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gymnasium.wrappers.FrameStackObservation):
            shape = env.observation_space.shape
            return env.stack_size if shape and shape[0] == env.stack_size else 0
        if env.observation_space != env.env.observation_space:
            return 0  # a wrapper outside the stack changed the observations: they are no longer stacks
        env = env.env
    return 0
