"""Build gymnasium envs by id, turning every failure into one clear `EnvError`.

`env.id` is a registered gymnasium id (`CartPole-v1`), an Atari or MinAtar id (`ALE/Breakout-v5`,
`MinAtar/Breakout-v1`: registered on first use, no import needed), a registered id in a module that
registers it on import (`package.module:EnvName-v0`, gymnasium's convention), or an env class in a module
(`popgym.envs.position_only_cartpole:PositionOnlyCartPoleEasy`). The env is then wrapped by the preset's
wrappers (`env.preset`) and `env.wrappers`, the train-only ones only for training envs (a rollout
worker's; not the evaluator's). Discrete and MultiDiscrete observations are one-hot encoded into a
float32 Box; Dict and Tuple observations stay trees of arrays (`distrl.envs.structured`).
"""
from __future__ import annotations

import difflib
import importlib
import sys
import warnings
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import parse_env_id

from distrl.config.sections import ENV_PRESETS
from distrl.core import EnvSpec
from distrl.envs.errors import EnvError, one_line
from distrl.envs.normalize import Normalization, check_normalizable, normalization_for, normalized
from distrl.envs.structured import structured
from distrl.envs.wrappers import WrapperSpec, apply_wrappers, frame_stack_of, parse_wrappers

__all__ = ["EnvError", "check_env", "env_spec", "import_module_of", "make_env"]


def _register_namespace(env_id: str) -> None:
    """Register the ids of the package that provides `env_id`'s namespace, the first time one is asked for
    (importing minatar takes ~2 s, so it is not done for other envs)."""
    namespace = env_id.partition("/")[0] if "/" in env_id else ""
    if namespace == "ALE":
        import ale_py  # with gymnasium >= 1.1 its import registers the ALE/ ids

        gym.register_envs(ale_py)
        # Errors only: the first emulator otherwise prints a banner on stderr, and a config mistake is one line.
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    elif namespace == "MinAtar" and not any(k.startswith("MinAtar/") for k in gym.envs.registry):
        import minatar.gym

        minatar.gym.register_envs()


def _mujoco_warnings_through_python(env_id: str) -> None:
    """MuJoCo prints its warnings from C; for a MuJoCo id they go through Python's `warnings` instead, so
    that building an env stays quiet (gymnasium's own assets use an attribute MuJoCo 4 deprecates, and every
    evaluation builds its envs) while a warning of the simulation itself is still shown."""
    spec = gym.envs.registry.get(env_id)
    if spec is None or not str(spec.entry_point).startswith("gymnasium.envs.mujoco"):
        return
    try:
        import mujoco
    except ImportError:
        return  # the env's constructor says which package is missing
    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(lambda message: warnings.warn(f"MuJoCo: {message.strip()}", RuntimeWarning))


def import_module_of(env_id: str) -> tuple[Any, str]:
    """(imported module, name) of a `module:name` id, or EnvError naming what is wrong with it."""
    module, _, name = env_id.partition(":")
    if not module or not name:
        raise EnvError(f"config key 'env.id': {env_id!r} must look like module:Name")
    try:
        return importlib.import_module(module), name
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a relative or empty name (TypeError, ValueError),
        # a missing module, or whatever the module's own code raises on import: the id names the wrong thing
        raise EnvError(f"config key 'env.id': cannot import {module!r} for {env_id!r}: {one_line(e)}") from None


# Packages whose import registers ids, by how their ids start: such an id is written `module:Id`.
REGISTERED_BY = {"MiniGrid-": "minigrid", "BabyAI-": "minigrid", "Vizdoom": "vizdoom.gymnasium_wrapper",
                 "popgym-": "popgym"}


def _versions_near(env_id: str) -> list[str]:
    """The registered versions of `env_id`'s name nearest its version, newest first ([] for an id without
    a version): difflib would rank HalfCheetah-v2 above HalfCheetah-v5 for HalfCheetah-v99."""
    try:
        namespace, name, asked = parse_env_id(env_id)
    except gym.error.Error:
        return []
    if asked is None:
        return []
    key = ((namespace or "").lower(), name.lower())
    same = [s for s in gym.envs.registry.values()
            if s.version is not None and ((s.namespace or "").lower(), s.name.lower()) == key]
    nearest = sorted(same, key=lambda s: (abs(s.version - asked), -s.version))[:3]
    return [s.id for s in sorted(nearest, key=lambda s: -s.version)]


def _close_ids(env_id: str) -> list[str]:
    """Registered ids a user may have meant: other versions of the same name, else near spellings."""
    versions = _versions_near(env_id)
    if versions:
        return versions
    same = sorted(k for k in gym.envs.registry if k.split("-")[0].lower() == env_id.split("-")[0].lower())
    near = difflib.get_close_matches(env_id, list(gym.envs.registry), n=3, cutoff=0.6)
    return list(dict.fromkeys(same + near))[:3]


def _unknown_id_hint(env_id: str) -> str:
    """How to write an id a package registers when it is imported, else the ids a user may have meant."""
    module = next((m for prefix, m in REGISTERED_BY.items() if env_id.startswith(prefix)), None)
    if module is not None and module not in sys.modules:
        return f" (an id registered by a package is written package:Id: {module}:{env_id})"
    close = _close_ids(env_id)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _constructor(env_id: str) -> Callable[..., gym.Env]:
    """What builds `env_id` from kwargs, or EnvError naming what is wrong with the id."""
    if ":" not in env_id:
        _register_namespace(env_id)
        if env_id in gym.envs.registry:
            _mujoco_warnings_through_python(env_id)
            return lambda **kw: gym.make(env_id, **kw)
        raise EnvError(f"config key 'env.id': unknown gymnasium environment {env_id!r}{_unknown_id_hint(env_id)}")
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


def _preset(preset: str, env_id: str, kwargs: dict | None) -> tuple[dict | None, list[WrapperSpec]]:
    """(the base env's kwargs, the preset's wrappers)."""
    if preset == "none":
        return kwargs, []
    if preset == "atari":
        from distrl.envs.atari import atari_base_kwargs, atari_wrappers

        return atari_base_kwargs(env_id, kwargs), atari_wrappers()
    raise EnvError(f"config key 'env.preset': unknown preset {preset!r} (known: {', '.join(ENV_PRESETS)})")


# Packages an env id may need that a distrl extra installs: the module gymnasium failed to import -> the extra.
EXTRAS = {"mujoco": "mujoco"}


def missing_package(env_id: str, e: Exception) -> str:
    """One line naming the package `env_id` needs and how to install it (gymnasium's DependencyNotInstalled
    carries the failed import as its cause)."""
    module = getattr(e.__cause__, "name", None)
    if module is None:
        return f"config key 'env.id': {env_id} needs a package that is not installed: {one_line(e)}"
    top = module.split(".")[0]
    how = f"pip install -e '.[{EXTRAS[top]}]'" if top in EXTRAS else one_line(e)
    return f"config key 'env.id': {env_id} needs the package {top!r}, which is not installed ({how})"


def _base_env(env_id: str, kwargs: dict | None) -> gym.Env:
    make = _constructor(env_id)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gymnasium deprecation chatter is not the user's problem
            return make(**(kwargs or {}))
    except gym.error.DependencyNotInstalled as e:
        raise EnvError(missing_package(env_id, e)) from None
    except Exception as e:  # noqa: BLE001 - any constructor failure is the config's env.kwargs or env.id
        raise EnvError(f"config key 'env.kwargs': {env_id} could not be built with {kwargs or {}}: {one_line(e)}") from None


def make_env(env_id: str, kwargs: dict[str, Any] | None = None, *, wrappers: list | None = None,
             preset: str = "none", training: bool = True, normalization: Normalization | None = None,
             obs_keys: list | None = None, action_mask: str = "none") -> gym.Env:
    """The env `env_id` built with `kwargs`, inside the preset's wrappers, then `wrappers` (the raw
    `env.wrappers` list), then `env.obs_keys` and `env.action_mask` (`distrl.envs.structured`), then the
    `normalization` wrappers; `training=False` leaves out the train-only ones (an evaluator's env)."""
    specs = parse_wrappers(wrappers)  # before building: a bad list costs no env
    base_kwargs, chain = _preset(preset, env_id, kwargs)
    env = _base_env(env_id, base_kwargs)
    if preset == "atari":
        from distrl.envs.atari import check_atari

        check_atari(env, env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = apply_wrappers(env, chain + specs, training)
        if normalization is not None and normalization.cfg.obs:  # before a Discrete's code becomes floats
            check_normalizable(env.observation_space)
        env = structured(_flat_observations(env), env_id, obs_keys, action_mask)
        return normalized(env, normalization, training)


def _spec(env: gym.Env) -> EnvSpec:
    return EnvSpec(env.observation_space, env.action_space, frame_stack=frame_stack_of(env))


def _first_failing(env_id: str, kwargs: dict | None, wrappers: list | None, preset: str) -> str:
    """The config key of the first wrapper after which a reset and a step fail ('env.kwargs' if the bare env fails)."""
    base_kwargs, chain = _preset(preset, env_id, kwargs)
    specs = chain + parse_wrappers(wrappers)
    for n in range(len(specs) + 1):
        env = apply_wrappers(_base_env(env_id, base_kwargs), specs[:n], training=True)
        try:
            env.reset(seed=0)
            env.step(env.action_space.sample())
        except Exception:  # noqa: BLE001 - we only look for where it fails
            return specs[n - 1].key if n else "env.kwargs"
        finally:
            env.close()
    return "env.kwargs"


def check_env(env_id: str, kwargs: dict[str, Any] | None = None, *, wrappers: list | None = None,
              preset: str = "none", normalize=None, obs_keys: list | None = None, action_mask: str = "none") -> EnvSpec:
    """Build the training env, reset it and take one step, and build the evaluation env: an env whose
    kwargs or wrappers fail only there, or whose train-only wrappers change its spaces, is caught before any
    worker starts. The training env's spec, or EnvError. `normalize`: the env.normalize section."""
    try:
        env = make_env(env_id, kwargs, wrappers=wrappers, preset=preset, training=True,
                       normalization=normalization_for(normalize, True), obs_keys=obs_keys, action_mask=action_mask)
    except TypeError as e:  # the normalization wrappers' own refusal (an observation space they cannot take)
        raise EnvError(f"config key 'env.normalize': {one_line(e)}") from None
    try:
        env.reset(seed=0)
        env.step(env.action_space.sample())
        spec = _spec(env)
    except EnvError:  # a mask or observation the env gives wrong: its own key and line
        raise
    except Exception as e:  # noqa: BLE001 - whatever the env raises, its config made it
        key = _first_failing(env_id, kwargs, wrappers, preset) if wrappers or preset != "none" else "env.kwargs"
        what = f"{env_id} with {kwargs or {}}" if key == "env.kwargs" else f"{env_id} with this wrapper"
        raise EnvError(f"config key '{key}': {what} fails on reset or step: {one_line(e)}") from None
    finally:
        env.close()
    evaluation = make_env(env_id, kwargs, wrappers=wrappers, preset=preset, training=False,
                          normalization=normalization_for(normalize, False), obs_keys=obs_keys, action_mask=action_mask)
    try:
        if (evaluation.observation_space, evaluation.action_space) != (spec.observation_space, spec.action_space):
            raise EnvError("config key 'env.wrappers': a train_only wrapper changes the observation or action "
                           f"space ({spec.observation_space} in training, {evaluation.observation_space} in "
                           "evaluation): the evaluator could not run the trained policy")
    finally:
        evaluation.close()
    return spec


def env_spec(env_id: str, kwargs: dict[str, Any] | None = None, *, wrappers: list | None = None,
             preset: str = "none", normalize=None, obs_keys: list | None = None, action_mask: str = "none") -> EnvSpec:
    """The training env's spec (spaces, and its frame stack), without stepping it."""
    env = make_env(env_id, kwargs, wrappers=wrappers, preset=preset, training=True,
                   normalization=normalization_for(normalize, True), obs_keys=obs_keys, action_mask=action_mask)
    try:
        return _spec(env)
    finally:
        env.close()
