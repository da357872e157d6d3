"""Spaces as the protocol declares them (`welcome`: plain data, `distrl.envs.spaces` writes it), read on either
side of the wire: where an observation's leaves are, their names, shapes and stored dtypes. numpy only.

A structured observation travels shaped like its space: a Dict's as a map with exactly its keys, a Tuple's as
a list, each leaf an array (a number, nested lists, an array object). Several rows of it (an `experience`
segment's K observations) are the same shape with K rows in every leaf. A leaf's **name** is its path, Dict
keys and Tuple indices joined by "." (`image`, `sensors.0`); a flat space's one leaf is named "". These are
the names `distrl.tree.named_leaves` gives and the exported ONNX file's inputs (its one input `obs` for "").
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

STRUCTURES = ("dict", "tuple")
PROTOCOL_1_TYPES = ("box", "discrete")


def protocol_for(*spaces: dict) -> int:
    """The oldest protocol version that carries these spaces: 1 for Box and Discrete from 0, else 2."""
    return 1 if all(s["type"] in PROTOCOL_1_TYPES and not s.get("start") for s in spaces) else 2


def leaf_dtype(space: dict) -> np.dtype:
    """The dtype a leaf is stored and acted on in: a Box's own, int64 for Discrete and MultiDiscrete, int8 for
    MultiBinary (as gymnasium gives it)."""
    kind = space["type"]
    if kind == "box":
        return np.dtype(space.get("dtype", "float32"))
    return np.dtype(np.int8 if kind == "multi_binary" else np.int64)


def leaf_shape(space: dict) -> tuple[int, ...]:
    kind = space["type"]
    if kind == "discrete":
        return ()
    if kind == "multi_discrete":
        return np.shape(space["nvec"])
    if kind == "multi_binary":
        n = space["n"]
        return tuple(n) if isinstance(n, list) else (n,)
    return tuple(space["shape"])


def leaf_range(space: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """[low, high) of an integer leaf's values (broadcast to its shape), None for a Box."""
    kind = space["type"]
    if kind == "box":
        return None
    if kind == "multi_binary":
        return np.zeros(leaf_shape(space), np.int64), np.full(leaf_shape(space), 2, np.int64)
    n = np.asarray(space["n"] if kind == "discrete" else space["nvec"], np.int64)
    start = np.broadcast_to(np.asarray(space.get("start", 0), np.int64), n.shape)
    return start, start + n


def leaf_spaces(space: dict, path: str = "") -> list[tuple[str, dict]]:
    """(name, leaf space) of every leaf, in the space's order."""
    if space["type"] not in STRUCTURES:
        return [(path, space)]
    return [leaf for name, sub in _parts(space) for leaf in leaf_spaces(sub, _join(path, name))]


def read(space: dict, value: Any, leaf: Callable[[str, dict, Any], Any], path: str = "") -> Any:
    """`value`, shaped like `space`, as dicts and tuples holding `leaf(name, leaf space, value)` at its leaves
    (a flat space: that one leaf); ValueError naming what is missing, extra or of the wrong kind."""
    kind = space["type"]
    if kind == "dict":
        keys = space["spaces"]
        if not isinstance(value, dict) or set(value) != set(keys):
            got = sorted(map(str, value)) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"{_where(path)} is a map with the keys {sorted(keys)}, got {got}")
        return {k: read(sub, value[k], leaf, _join(path, k)) for k, sub in keys.items()}
    if kind == "tuple":
        parts = space["spaces"]
        if not isinstance(value, (list, tuple)) or len(value) != len(parts):
            got = f"{len(value)} of them" if isinstance(value, (list, tuple)) else type(value).__name__
            raise ValueError(f"{_where(path)} is a list of {len(parts)} values, got {got}")
        return tuple(read(sub, v, leaf, _join(path, i)) for i, (sub, v) in enumerate(zip(parts, value)))
    return leaf(path, space, value)


def nest(space: dict, leaves: dict[str, Any], path: str = "") -> Any:
    """`space`'s shape (dicts and tuples; a flat space: the leaf itself) holding `leaves[name]` at each leaf."""
    if space["type"] not in STRUCTURES:
        return leaves[path]
    built = [(name, nest(sub, leaves, _join(path, name))) for name, sub in _parts(space)]
    return dict(built) if space["type"] == "dict" else tuple(v for _, v in built)


def _parts(space: dict) -> list[tuple[Any, dict]]:
    parts = space["spaces"]
    return list(parts.items()) if space["type"] == "dict" else list(enumerate(parts))


def _join(path: str, name) -> str:
    return f"{path}.{name}" if path else str(name)


def _where(path: str) -> str:
    return f"the observation's {path!r}" if path else "the observation"
