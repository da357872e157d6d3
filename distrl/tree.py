"""Structured observations: one tree of arrays, and the few operations every room applies to it.

An env with a Dict or Tuple observation space (nested too) gives dicts and tuples of arrays; a flat env
gives one array, which is a tree of one leaf: every function here takes both, so the env vector,
fragments, the trajectory queue, the learner and the networks handle both with the same code and no
test of the observation's type. Leaves are numpy arrays or torch tensors; a tree's batch axes lead every
leaf (a vector of E envs: (E, ...); a fragment: (T, E, ...)).

The tree walk is optree's (the C++ pytree torch uses): mapping a function over a one-leaf tree costs
~2 us, over a Dict of two ~3.5 us (`python -m bench.micro tree`), against a worker step of ~100 us.
Dicts flatten in sorted key order, so a leaf's position is the same on every process.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import optree
from gymnasium import spaces

Tree = Any  # an array, or dicts / tuples of trees

MASK_KEY = "action_mask"  # the leaf holding an observation's legal actions (`distrl.envs.structured`)

# The spaces a leaf may have: each gives arrays a network takes.
LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def map(fn: Callable, tree: Tree, *rest: Tree) -> Tree:  # noqa: A001 - the tree's map, as optree names it
    """`fn` applied leaf by leaf (leaves of `rest` at the same positions as further arguments)."""
    return optree.tree_map(fn, tree, *rest)


def leaves(tree: Tree) -> list:
    return optree.tree_leaves(tree)


def rows(tree: Tree) -> int:
    """The size of the leading axis (every leaf's)."""
    return len(optree.tree_leaves(tree)[0])


def stack(trees: list[Tree]) -> Tree:
    """Trees of one structure stacked along a new leading axis."""
    return optree.tree_map(lambda *xs: np.stack(xs), *trees)


def concatenate(trees: list[Tree], axis: int = 0) -> Tree:
    return optree.tree_map(lambda *xs: np.concatenate(xs, axis=axis), *trees)


# A one-leaf tree takes the array's own operation at once in the functions an env step calls per env: the
# tree walk would double a flat env's bookkeeping per step.

def index(tree: Tree, idx) -> Tree:
    """Every leaf indexed by `idx` (a row, a slice, an index array)."""
    if isinstance(tree, np.ndarray):
        return tree[idx]
    return optree.tree_map(lambda x: x[idx], tree)


def assign(tree: Tree, idx, value: Tree) -> None:
    """`leaf[idx] = value's leaf`, for every leaf, in place."""
    if isinstance(tree, np.ndarray):
        tree[idx] = value
    elif isinstance(tree, dict):  # walked here: two optree flattens per call cost more for a Dict of a few leaves
        for k, dst in tree.items():
            assign(dst, idx, value[k])
    else:
        for dst, src in zip(optree.tree_leaves(tree), optree.tree_leaves(value)):
            dst[idx] = src


def empty(lead: tuple[int, ...], like: Tree) -> Tree:
    """Uninitialised arrays shaped `lead + leaf.shape` in each leaf's dtype (`like`: one row)."""
    return optree.tree_map(lambda x: np.empty((*lead, *np.shape(x)), np.asarray(x).dtype), like)


def as_arrays(tree: Tree) -> Tree:
    """Every leaf as a numpy array."""
    if isinstance(tree, np.ndarray):
        return tree
    return optree.tree_map(np.asarray, tree)


def copy(tree: Tree) -> Tree:
    if isinstance(tree, np.ndarray):
        return tree.copy()
    return optree.tree_map(lambda x: x.copy(), tree)


def flatten_lead(tree: Tree, n: int) -> Tree:
    """The first `n` axes of every leaf merged into one (time-major (T, E, ...) -> (T*E, ...))."""
    return optree.tree_map(lambda x: x.reshape(-1, *x.shape[n:]), tree)


def nbytes(tree: Tree) -> int:
    return sum(x.nbytes for x in optree.tree_leaves(tree))


def all_finite(tree: Tree) -> bool:
    """No NaN or infinity in any float leaf."""
    if isinstance(tree, np.ndarray):
        return bool(np.isfinite(tree).all()) if tree.dtype.kind == "f" else True
    if isinstance(tree, dict):
        return all(all_finite(v) for v in tree.values())
    return all(np.isfinite(x).all() for x in optree.tree_leaves(tree) if np.asarray(x).dtype.kind == "f")


def structure_text(tree: Tree) -> str:
    """The keys of a tree, for a message: `{direction, image}`, `(0, 1)`, or `array` for one leaf."""
    paths = optree.tree_paths(tree)
    if paths == [()]:
        return "array"
    return "{" + ", ".join(path_name(p) for p in paths) + "}"


def path_name(path: tuple) -> str:
    """A leaf's path as one name: `image`, `sensors.camera`, `0`."""
    return ".".join(str(p) for p in path)


def named_leaves(tree: Tree) -> list[tuple[str, Any]]:
    """(name, leaf) in the tree's order; a one-leaf tree's leaf is named ``."""
    return [(path_name(p), x) for p, x in zip(optree.tree_paths(tree), optree.tree_leaves(tree))]


# --- columns: a store of named arrays (replay) holds a tree's leaves as columns of their own -------------
def to_columns(fields: dict) -> dict:
    """Named fields, each a tree, as named arrays: a leaf of field `obs` at key `image` is column
    `obs.image`, at a Tuple's index 1 `obs#1` (nesting continues: `obs.pos#0`); an array field keeps its
    name. Keys of a Dict observation hold neither `.` nor `#` (`envs.structured` refuses them)."""
    out: dict = {}
    for name, value in fields.items():
        _columns(name, value, out)
    return out


def _columns(name: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _columns(f"{name}.{k}", v, out)
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            _columns(f"{name}#{i}", v, out)
    else:
        out[name] = value


def from_columns(columns: dict) -> dict:
    """The fields `to_columns` made the columns of, each tree rebuilt from its columns' names."""
    out: dict = {}
    for name, value in columns.items():
        node, parts = out, _name_parts(name)
        for key in parts[:-1]:
            node = node.setdefault(key, {})
        node[parts[-1]] = value
    return {k: _tupled(v) for k, v in out.items()}


def _name_parts(name: str) -> list:
    """`obs.pos#0` -> ["obs", "pos", 0]: a Dict's keys as strings, a Tuple's indices as ints."""
    parts, key, index = [], "", False
    for ch in name + ".":
        if ch in ".#":
            parts.append(int(key) if index else key)
            key, index = "", ch == "#"
        else:
            key += ch
    return parts


def _tupled(node):
    """Nodes whose keys are the ints 0..n-1 (a Tuple's) as tuples, recursively."""
    if not isinstance(node, dict):
        return node
    node = {k: _tupled(v) for k, v in node.items()}
    if node and all(isinstance(k, int) for k in node):
        return tuple(node[i] for i in range(len(node)))
    return node


def mask_of(obs: Tree):
    """The `action_mask` leaf of an observation, or None."""
    return obs.get(MASK_KEY) if isinstance(obs, dict) else None


def has_mask(space) -> bool:
    """The observation space has an `action_mask` leaf (a Dict with that key)."""
    return isinstance(space, spaces.Dict) and MASK_KEY in space.spaces


def with_mask(obs: Tree, mask) -> dict:
    """`obs` with `mask` as its `action_mask` leaf: a dict's keys beside it, any other tree under the key `obs`."""
    return {**obs, MASK_KEY: mask} if isinstance(obs, dict) else {"obs": obs, MASK_KEY: mask}


def with_mask_space(space: spaces.Space, size: int) -> spaces.Dict:
    """The space of `with_mask`'s trees for observations of `space` and masks of `size` actions."""
    mask = spaces.MultiBinary(size)
    return spaces.Dict({**space.spaces, MASK_KEY: mask}) if isinstance(space, spaces.Dict) else \
        spaces.Dict({"obs": space, MASK_KEY: mask})


def unflatten_like(tree: Tree, values: list) -> Tree:
    """A tree of `tree`'s structure holding `values` at its leaves, in order."""
    return optree.tree_unflatten(optree.tree_structure(tree), values)


# --- spaces -------------------------------------------------------------------------------------------
def space_tree(space) -> Tree:
    """An observation space as a tree of its leaf spaces (a Dict space: a dict, a Tuple space: a tuple;
    any other space is a leaf); a leaf's space is one of LEAF_SPACES or a problem `leaf_problem` names."""
    if isinstance(space, spaces.Dict):
        return {k: space_tree(s) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(space_tree(s) for s in space.spaces)
    return _Leaf(space)


def as_space(node) -> Any:
    """Dicts and tuples of leaf spaces (`unflatten_like(space_tree(s), leaf spaces)`) as one gymnasium space."""
    if isinstance(node, dict):
        return spaces.Dict({k: as_space(v) for k, v in node.items()})
    if isinstance(node, tuple):
        return spaces.Tuple(tuple(as_space(v) for v in node))
    return node


class _Leaf:
    """A leaf space inside a space tree (a wrapper: optree would walk a space's own attributes)."""

    __slots__ = ("space",)

    def __init__(self, space):
        self.space = space


def leaf_spaces(space) -> list[tuple[str, Any]]:
    """(name, space) of every leaf of an observation space, in the tree's order."""
    return [(name, leaf.space) for name, leaf in named_leaves(space_tree(space))]


def is_structured(space) -> bool:
    return isinstance(space, (spaces.Dict, spaces.Tuple))


def leaf_problem(space) -> str | None:
    """Why `space` cannot be an observation leaf (no network takes it), or None."""
    return None if isinstance(space, LEAF_SPACES) else f"a {type(space).__name__}, which gives no arrays a network takes"


def leaf_dtype(space) -> np.dtype:
    """The dtype a leaf of `space` is stored in: a Box's own, and int64 for the integer spaces (MultiBinary
    as int8, as gymnasium gives it)."""
    if isinstance(space, spaces.Box):
        return np.dtype(space.dtype)
    return np.dtype(np.int8) if isinstance(space, spaces.MultiBinary) else np.dtype(np.int64)


def as_stored(space, obs: Tree) -> Tree:
    """One observation of `space` as plain dicts and tuples of arrays in their stored dtypes (a Discrete
    leaf's int becomes a 0-d int64 array); ValueError naming the first key that the observation lacks or
    has beyond the space's."""
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, dict) or set(obs) != set(space.spaces):
            got = sorted(str(k) for k in obs) if isinstance(obs, dict) else type(obs).__name__
            raise ValueError(f"an observation with keys {got}, where the space has {sorted(space.spaces)}")
        return {k: as_stored(s, obs[k]) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        if not isinstance(obs, tuple) or len(obs) != len(space.spaces):
            raise ValueError(f"an observation that is not a tuple of {len(space.spaces)}: {type(obs).__name__}")
        return tuple(as_stored(s, o) for s, o in zip(space.spaces, obs))
    return np.asarray(obs, leaf_dtype(space))


def sample(space, rows: int, seed: int = 0) -> Tree:
    """`rows` observations drawn from `space`, stacked, in their stored dtypes."""
    space.seed(seed)
    return stack([as_stored(space, space.sample()) for _ in range(rows)])
