"""Every agent's observation of a PettingZoo env as one tree of (N, ...) arrays (`distrl.tree`), with its
action mask: what `ParallelEnvAdapter` gives a step.

One agent's space, for all of them: the agents' spaces leaf by leaf (a flat Box is a tree of one leaf, so
it follows the same rule). Their trees must have the same keys. A Box leaf of one shape for every agent
keeps it (bounds: the widest); of differing shapes it is flattened and zero-padded at the end to the
largest size (bounds padded with 0). Any other leaf (Discrete, MultiDiscrete, MultiBinary) must be the
same for every agent. A flat Box observation is float32; a structured one's leaves keep their stored
dtype (`tree.leaf_dtype`; floats as float32, uint8 images stay uint8).

The action mask is the `action_mask` leaf, as for one agent (`distrl.envs.structured`), by
`env.action_mask`: `obs` the agent's Dict `action_mask` key (PettingZoo classic's), `info` its
`infos[agent]["action_mask"]` (a flat observation then becomes `{obs, action_mask}`), `auto` the first of
those the env gives (a reset's infos tell), `none` neither (a Dict's `action_mask` key is dropped). A mask
is int8, 1 = legal, one entry per action of a Discrete action space. An agent out of the episode has a zero
observation and a mask allowing every action (its row acts on nothing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from distrl import tree
from distrl.envs.errors import EnvError
from distrl.envs.structured import MASK_KEY, MASK_SOURCES, MaskError, check_obs_keys, mask_size


@dataclass
class Leaf:
    """How the agents' leaves at one position of the tree become one (N, ...) array."""

    name: str
    space: Any  # the merged space of one agent's leaf
    flatten: bool  # differing shapes: flattened and zero-padded to `space`'s size
    mask: bool = False  # the action mask: checked, and all legal for an agent out of the episode

    def empty(self, n: int) -> np.ndarray:
        shape, dtype = (n, *self.space.shape), tree.leaf_dtype(self.space)
        return np.ones(shape, dtype) if self.mask else np.zeros(shape, dtype)

    def put(self, out: np.ndarray, i: int, x) -> None:
        if self.flatten:
            x = np.asarray(x).ravel()
            out[i, :x.size] = x
        else:
            out[i] = x


def _merge_box(name: str, boxes: list[spaces.Box], flat: bool) -> Leaf:
    """The padding rule on one Box leaf (module docstring)."""
    kinds = {np.dtype(b.dtype) for b in boxes}
    dtype = np.float32 if flat or any(k.kind == "f" for k in kinds) else np.result_type(*kinds)
    if len({b.shape for b in boxes}) == 1:
        low = np.min([b.low for b in boxes], axis=0)
        high = np.max([b.high for b in boxes], axis=0)
        return Leaf(name, spaces.Box(low.astype(dtype), high.astype(dtype), dtype=dtype), False)
    size = max(int(np.prod(b.shape)) for b in boxes)
    low, high = np.zeros(size, np.float64), np.zeros(size, np.float64)
    for b in boxes:
        m = int(np.prod(b.shape))
        low[:m] = np.minimum(low[:m], b.low.ravel())
        high[:m] = np.maximum(high[:m], b.high.ravel())
    return Leaf(name, spaces.Box(low.astype(dtype), high.astype(dtype), dtype=dtype), True)


def _merge(name: str, leaves: list, flat: bool, masks: int | None) -> Leaf:
    """One leaf position's merged space from every agent's (`masks`: the mask's size, for the mask leaf)."""
    if masks is not None:
        sizes = {int(np.prod(s.shape)) for s in leaves if isinstance(s, (spaces.Box, spaces.MultiBinary))}
        if len(leaves) != sum(isinstance(s, (spaces.Box, spaces.MultiBinary)) for s in leaves) or sizes != {masks}:
            raise EnvError(f"config key 'env.action_mask': the agents' {MASK_KEY!r} leaves are {leaves[0]}, not "
                           f"{masks} ones and zeros (one per action)")
        return Leaf(name, spaces.MultiBinary(masks), False, mask=True)
    for s in leaves:
        problem = tree.leaf_problem(s)
        if problem:
            raise EnvError(f"config key 'env.obs_keys': the agents' observation leaf {name or 'obs'!r} is {problem}")
    if all(isinstance(s, spaces.Box) for s in leaves):
        return _merge_box(name, leaves, flat)
    if any(s != leaves[0] for s in leaves):
        raise EnvError(f"the agents' observation leaf {name or 'obs'!r} differs between agents ({leaves[0]}, "
                       f"{next(s for s in leaves if s != leaves[0])}): only Box leaves are padded to one shape")
    return Leaf(name, leaves[0], False)


class AgentObservations:
    """Builds the (N, ...) tree of a step from a PettingZoo env's per-agent dicts (module docstring)."""

    def __init__(self, env: Any, agent_ids: list, action_space, obs_keys: list | None = None,
                 action_mask: str = "auto"):
        self.agent_ids = agent_ids
        given = [env.observation_space(a) for a in agent_ids]
        agent_spaces = [_selected(s, obs_keys) for s in given]
        self.source = _mask_source(env, agent_spaces, action_space, action_mask)
        self.mask_size = mask_size(action_space)
        if self.source == "none":  # a Dict's own mask key is dropped with it
            agent_spaces = [without_mask(s) for s in agent_spaces]
        self.spaces = agent_spaces
        # The keys taken from each agent's Dict observation (None: all it gives).
        self.keep = [None if s is g else list(s.spaces) for s, g in zip(agent_spaces, given)]
        names = _same_keys(agent_ids, agent_spaces)
        self.flat = not tree.is_structured(agent_spaces[0])  # a Box: a tree of one leaf, walked as such
        self.leaves = [_merge(n, [dict(tree.leaf_spaces(s))[n] for s in agent_spaces], self.flat,
                              self.mask_size if n == MASK_KEY and self.source == "obs" else None) for n in names]
        self.skeleton = tree.space_tree(agent_spaces[0])
        inner = tree.as_space(tree.unflatten_like(self.skeleton, [leaf.space for leaf in self.leaves]))
        self.space = inner if self.source != "info" else tree.with_mask_space(inner, self.mask_size)

    def stack(self, obs: dict, infos: dict, live: np.ndarray, step: int) -> tree.Tree:
        """The (N, ...) tree of the agents' observations `obs` (only the `live` ones'; masks from `infos` with
        the info source); `step`: the episode's step, for a message."""
        n = len(self.agent_ids)
        out = [leaf.empty(n) for leaf in self.leaves]
        masks = np.ones((n, self.mask_size), np.int8) if self.source == "info" else None
        for i, a in enumerate(self.agent_ids):
            if not (live[i] and a in obs):
                continue
            for leaf, dst, x in zip(self.leaves, out, self._agent_leaves(i, obs[a])):
                leaf.put(dst, i, self._checked(x, a, step) if leaf.mask else x)
            if masks is not None:
                info = infos.get(a) if isinstance(infos.get(a), dict) else {}
                if MASK_KEY not in info:
                    raise MaskError(f"config key 'env.action_mask': {a}'s info has no {MASK_KEY!r} "
                                    f"(step {step} of its episode)")
                masks[i] = self._checked(info[MASK_KEY], a, step)
        stacked = out[0] if self.flat else tree.unflatten_like(self.skeleton, out)
        return stacked if masks is None else tree.with_mask(stacked, masks)

    def _agent_leaves(self, i: int, obs) -> list[np.ndarray]:
        """Agent i's observation as its leaves in their stored dtypes (only the kept keys)."""
        if self.flat:  # its one leaf, cast where it is stored
            return [obs]
        if self.keep[i] is not None:
            obs = {k: obs[k] for k in self.keep[i] if k in obs}
        try:
            return tree.leaves(tree.as_stored(self.spaces[i], obs))
        except ValueError as e:
            raise EnvError(f"config key 'env.id': agent {self.agent_ids[i]} gave {e}") from None

    def _checked(self, raw, agent, step: int) -> np.ndarray:
        mask = np.asarray(raw)
        where = f"{agent} at step {step} of its episode"
        if mask.size != self.mask_size or mask.dtype.kind not in "biu":
            raise MaskError(f"config key 'env.action_mask': {where} gives a mask shaped {mask.shape} ({mask.dtype}); "
                            f"the actions take {self.mask_size} ones and zeros (bool or int)")
        mask = (mask.reshape(-1) != 0).astype(np.int8)
        if not mask.any():
            raise MaskError(f"{where}: the action mask allows no action")
        return mask


def _same_keys(agent_ids: list, agent_spaces: list) -> list[str]:
    """The names of the agents' leaves, which must be the same for every agent."""
    names = [[n for n, _ in tree.leaf_spaces(s)] for s in agent_spaces]
    for a, s, own in zip(agent_ids, agent_spaces, names):
        if own != names[0]:
            shown = [tree.structure_text(tree.space_tree(x)) for x in (agent_spaces[0], s)]
            raise EnvError(f"config key 'env.id': the agents' observations differ in their keys ({agent_ids[0]}: "
                           f"{shown[0]}, {a}: {shown[1]}); only a Box leaf's shape may differ")
    return names[0]


def _selected(space, keys: list | None):
    """`env.obs_keys` of an agent's Dict space."""
    if keys is None:
        return space
    check_obs_keys(space, keys, "an agent's")
    return spaces.Dict({k: space.spaces[k] for k in keys})


def without_mask(space):
    """A Dict space without its `action_mask` key; any other space as it is."""
    return spaces.Dict({k: s for k, s in space.spaces.items() if k != MASK_KEY}) if tree.has_mask(space) else space


def _mask_source(env, agent_spaces: list, action_space, asked: str) -> str:
    """Where the agents' masks come from: `asked`, with auto resolved (a reset's infos tell)."""
    if asked not in MASK_SOURCES:
        raise EnvError(f"config key 'env.action_mask': one of {', '.join(MASK_SOURCES)}, got {asked!r}")
    in_obs = [tree.has_mask(s) for s in agent_spaces]
    if asked == "none":
        return asked
    if any(in_obs) and not all(in_obs):
        raise EnvError(f"config key 'env.action_mask': some agents' observations have an {MASK_KEY!r} key and "
                       "some not")
    if asked == "obs" and not all(in_obs):
        raise EnvError(f"config key 'env.action_mask': obs takes the observation's {MASK_KEY!r} key; the agents' "
                       f"observations are {agent_spaces[0]}")
    if mask_size(action_space) is None or not isinstance(action_space, spaces.Discrete):
        if asked in ("obs", "info") or all(in_obs):
            raise EnvError(f"config key 'env.action_mask': masks are for Discrete actions; the agents' are "
                           f"{action_space} (env.action_mask: none leaves the mask out)")
        return "none"
    if asked != "auto":
        return asked
    if all(in_obs):
        return "obs"
    _, infos = env.reset()
    return "info" if any(isinstance(i, dict) and MASK_KEY in i for i in (infos or {}).values()) else "none"
