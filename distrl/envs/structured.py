"""`env.obs_keys` and `env.action_mask`: a structured observation made ready for a network.

A Dict or Tuple observation reaches distrl as a tree of arrays (`distrl.tree`), each leaf a Box, Discrete,
MultiDiscrete or MultiBinary space in its stored dtype. `env.obs_keys` keeps the named keys of a Dict
observation (gymnasium's FilterObservation), so leaves no network takes (gymnasium's Text, MiniGrid's
`mission`) can be dropped; one left in is refused in one line naming it.

An action mask travels as the observation leaf `action_mask` (a MultiBinary of one entry per action, the
factors' masks concatenated for MultiDiscrete actions, as sb3-contrib's MaskablePPO takes them): so it is
stored with the experience it belongs to, the next state's mask is in `next_obs`, and every room that moves
observations moves masks. `env.action_mask`: `obs` takes the Dict observation's own `action_mask` key, `info`
the env's `info["action_mask"]` (a flat observation then becomes `{obs, action_mask}`), `auto` the first of
those the env gives, `none` neither.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from distrl import tree
from distrl.envs.errors import EnvError

MASK_KEY = tree.MASK_KEY
MASK_SOURCES = ("auto", "info", "obs", "none")


class MaskError(EnvError):
    """The env's action mask is not one distrl can act on (wrong shape, no legal action)."""


def mask_size(action_space) -> int | None:
    """Entries in a mask for `action_space` (one per logit), or None for actions no mask applies to."""
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiDiscrete):
        return int(np.sum(action_space.nvec))
    if isinstance(action_space, spaces.MultiBinary):
        return 2 * int(np.prod(action_space.shape))
    return None


def structured(env: gym.Env, env_id: str, obs_keys: list | None, action_mask: str) -> gym.Env:
    """`env` with its observation's keys selected, its mask (if any) as the `action_mask` leaf, and every
    leaf checked and stored as arrays; a flat env without a mask comes back as it is."""
    if obs_keys is not None:
        env = _select(env, env_id, obs_keys)
    flat = not tree.is_structured(env.observation_space)
    source = _mask_source(env, env_id, action_mask)
    if source != "none":
        env = MaskedObservation(env, env_id, source)
    if flat:  # {obs, action_mask} of arrays, as MaskedObservation makes it: nothing to convert or check
        return env
    odd = _odd_key(env.observation_space)
    if odd is not None:
        raise EnvError(f"config key 'env.id': {env_id}'s observation key {odd!r} holds '.' or '#', which name a "
                       f"leaf's path in replay (rename it in a wrapper)")
    for name, space in tree.leaf_spaces(env.observation_space):
        problem = tree.leaf_problem(space)
        if problem:
            keep = [n for n, s in tree.leaf_spaces(env.observation_space) if tree.leaf_problem(s) is None]
            raise EnvError(f"config key 'env.obs_keys': {env_id}'s observation leaf {name!r} is {problem} "
                           f"(keep the others: env.obs_keys: [{', '.join(keep)}])")
    return StoredObservation(env, env_id)


def _odd_key(space) -> str | None:
    """The first Dict key (at any depth) that holds '.' or '#', or None."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            if "." in key or "#" in key:
                return key
            found = _odd_key(sub)
            if found is not None:
                return found
    if isinstance(space, spaces.Tuple):
        return next((k for k in map(_odd_key, space.spaces) if k is not None), None)
    return None


def _select(env: gym.Env, env_id: str, keys) -> gym.Env:
    check_obs_keys(env.observation_space, keys, f"{env_id}'s")
    return gym.wrappers.FilterObservation(env, keys)


def check_obs_keys(space, keys, whose: str) -> None:
    """EnvError unless `keys` (env.obs_keys) are keys of the Dict observation `space` (`whose`, for a message:
    "CartPole-v1's")."""
    if not isinstance(space, spaces.Dict):
        raise EnvError(f"config key 'env.obs_keys': selects keys of a Dict observation; {whose} is {space}")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise EnvError(f"config key 'env.obs_keys': a list of key names, got {keys!r}")
    missing = [k for k in keys if k not in space.spaces]
    if missing:
        raise EnvError(f"config key 'env.obs_keys': {whose} observation has no key {missing[0]!r} "
                       f"(its keys: {', '.join(space.spaces)})")


def _mask_source(env: gym.Env, env_id: str, asked: str) -> str:
    """Where the mask comes from: `asked`, with auto resolved (a reset's info tells whether it has one)."""
    if asked not in MASK_SOURCES:
        raise EnvError(f"config key 'env.action_mask': one of {', '.join(MASK_SOURCES)}, got {asked!r}")
    in_obs = tree.has_mask(env.observation_space)
    if asked == "obs" and not in_obs:
        raise EnvError(f"config key 'env.action_mask': obs takes the observation's {MASK_KEY!r} key; "
                       f"{env_id}'s observation is {env.observation_space}")
    if asked == "auto":
        if in_obs:
            return "obs"
        if mask_size(env.action_space) is None:
            return "none"
        _, info = env.reset()
        return "info" if MASK_KEY in info else "none"
    if asked != "none" and mask_size(env.action_space) is None:
        raise EnvError(f"config key 'env.action_mask': masks are for Discrete, MultiDiscrete and MultiBinary "
                       f"actions; {env_id}'s are {env.action_space}")
    return asked


class MaskedObservation(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """The env's mask checked and put in the observation as the `action_mask` leaf (int8, 1 = legal)."""

    def __init__(self, env: gym.Env, env_id: str, source: str):
        gym.utils.RecordConstructorArgs.__init__(self, env_id=env_id, source=source)  # gymnasium can rebuild it
        gym.Wrapper.__init__(self, env)
        self.env_id, self.source, self.steps = env_id, source, 0
        self.size = mask_size(env.action_space)
        self.observation_space = tree.with_mask_space(env.observation_space, self.size)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.steps = 0
        return self._with_mask(obs, info), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        return self._with_mask(obs, info), reward, terminated, truncated, info

    def _with_mask(self, obs, info):
        if self.source == "obs":
            raw = obs[MASK_KEY]
        elif MASK_KEY not in info:
            where = f"{self.env_id} at step {self.steps} of its episode"
            raise MaskError(f"config key 'env.action_mask': info has no {MASK_KEY!r} ({where})")
        else:
            raw = info[MASK_KEY]
        mask = np.asarray(raw)
        if mask.shape != (self.size,) or mask.dtype.kind not in "biu":
            where = f"{self.env_id} at step {self.steps} of its episode"
            raise MaskError(f"config key 'env.action_mask': {where} gives a mask shaped {mask.shape} ({mask.dtype}); "
                            f"its actions {self.env.action_space} take {self.size} ones and zeros (bool or int)")
        if mask.dtype != np.int8 or mask.max() > 1 or mask.min() < 0:
            mask = (mask != 0).astype(np.int8)
        if not mask.any():
            where = f"{self.env_id} at step {self.steps} of its episode"
            raise MaskError(f"{where}: the action mask allows no action")
        return tree.with_mask(obs, mask)  # a mask the obs held is replaced by its checked copy


class StoredObservation(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Every leaf an array in its stored dtype (a Discrete leaf's int a 0-d int64), and each observation's
    keys checked against the space's: an env whose Dict changes keys between reset and step is refused."""

    def __init__(self, env: gym.Env, env_id: str):
        gym.utils.RecordConstructorArgs.__init__(self, env_id=env_id)
        gym.ObservationWrapper.__init__(self, env)
        self.env_id = env_id

    def observation(self, obs):
        try:
            return tree.as_stored(self.observation_space, obs)
        except ValueError as e:
            raise EnvError(f"config key 'env.id': {self.env_id} gave {e}") from None
