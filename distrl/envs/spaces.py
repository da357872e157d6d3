"""Spaces declared as plain data: in a config (`external.observation_space`) and on the simulator protocol.

    {type: discrete, n: 2}                                                # start: 0 unless given
    {type: box, shape: [4], dtype: float32, low: -.inf, high: .inf}     # low, high: a number or a list
    {type: multi_discrete, nvec: [3, 4]}                                 # nvec nested for more axes; start, dtype
    {type: multi_binary, n: 6}                                           # n: an int, or a list of axes
    {type: dict, spaces: {image: {...}, action_mask: {type: multi_binary, n: 6}}}
    {type: tuple, spaces: [{...}, {...}]}

Dict and Tuple observations nest (their leaves Box, Discrete, MultiDiscrete, MultiBinary); actions are
leaves. On the wire (JSON has no infinity) an infinite bound is the string "inf" or "-inf", and a bound is
one number when all its elements are equal, else a flat list (C order). Box and Discrete (from 0) are
protocol 1's; the others need protocol 2 (`distrl.client.spaces.protocol_for`).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from distrl import tree
from distrl.envs.structured import mask_size

BOX_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool")
INT_DTYPES = ("int8", "int16", "int32", "int64")
LEAVES = {"discrete": {"type", "n", "start"}, "box": {"type", "shape", "dtype", "low", "high"},
          "multi_discrete": {"type", "nvec", "start", "dtype"}, "multi_binary": {"type", "n"}}
STRUCTURES = {"dict": {"type", "spaces"}, "tuple": {"type", "spaces"}}


def space_from_data(d, key: str, action: bool = False):
    """The space `d` declares; ValueError naming `key` (the config key; a nested one's path:
    `key.spaces.image.shape`) and what is wrong. An `action` space is a leaf, and a Discrete one starts at 0
    (a policy picks 0 to n - 1)."""
    if not isinstance(d, dict):
        raise ValueError(f"config key '{key}': expected a mapping like {{type: discrete, n: 2}}, got {d!r}")
    kind = d.get("type", "discrete" if "n" in d else "box")
    known = {**LEAVES, "discrete": {"type", "n"}} if action else {**LEAVES, **STRUCTURES}
    if kind not in known:
        raise ValueError(f"config key '{key}.type': one of {', '.join(known)}, got {kind!r}")
    extra = set(d) - known[kind]
    if extra:
        raise ValueError(f"config key '{key}': a {kind} space takes {sorted(known[kind] - {'type'})}, not {sorted(extra)}")
    return READERS[kind](d, key)


def _discrete(d: dict, key: str) -> spaces.Discrete:
    n, start = d.get("n"), d.get("start", 0)
    if not _int(n) or n < 1:
        raise ValueError(f"config key '{key}.n': a positive integer, got {n!r}")
    if not _int(start):
        raise ValueError(f"config key '{key}.start': an integer, got {start!r}")
    return spaces.Discrete(n, start=start)


def _multi_discrete(d: dict, key: str) -> spaces.MultiDiscrete:
    nvec, dtype = _int_array(d.get("nvec"), f"{key}.nvec"), d.get("dtype", "int64")
    if not nvec.size or (nvec < 1).any():
        raise ValueError(f"config key '{key}.nvec': a (nested) list of positive integers, got {d.get('nvec')!r}")
    if dtype not in INT_DTYPES:
        raise ValueError(f"config key '{key}.dtype': one of {', '.join(INT_DTYPES)}, got {dtype!r}")
    start = _int_array(d.get("start", 0), f"{key}.start")
    try:
        start = np.broadcast_to(start, nvec.shape)
    except ValueError:
        raise ValueError(f"config key '{key}.start': one integer or one per element of nvec {nvec.shape}") from None
    return spaces.MultiDiscrete(nvec, dtype=np.dtype(dtype), start=start)


def _multi_binary(d: dict, key: str) -> spaces.MultiBinary:
    n = d.get("n")
    axes = n if isinstance(n, list) else [n]
    if not axes or not all(_int(k) and k > 0 for k in axes):
        raise ValueError(f"config key '{key}.n': a positive integer or a list of them, got {n!r}")
    return spaces.MultiBinary(n)


def _dict(d: dict, key: str) -> spaces.Dict:
    parts = d.get("spaces")
    if not isinstance(parts, dict) or not parts:
        raise ValueError(f"config key '{key}.spaces': a mapping of names to spaces, got {str(parts)[:60]}")
    for name in parts:
        # a leaf's path names it: "." joins a path, "#" a Tuple index in replay's columns (`distrl.tree`)
        if not isinstance(name, str) or not name or "." in name or "#" in name:
            raise ValueError(f"config key '{key}.spaces': a key is a non-empty name without '.' or '#', got {name!r}")
    return spaces.Dict({name: space_from_data(s, f"{key}.spaces.{name}") for name, s in parts.items()})


def _tuple(d: dict, key: str) -> spaces.Tuple:
    parts = d.get("spaces")
    if not isinstance(parts, list) or not parts:
        raise ValueError(f"config key '{key}.spaces': a list of spaces, got {str(parts)[:60]}")
    return spaces.Tuple([space_from_data(s, f"{key}.spaces.{i}") for i, s in enumerate(parts)])


def _box(d: dict, key: str) -> spaces.Box:
    shape, dtype = d.get("shape"), d.get("dtype", "float32")
    if not isinstance(shape, list) or not shape or not all(_int(n) and n > 0 for n in shape):
        raise ValueError(f"config key '{key}.shape': a list of positive integers, got {shape!r}")
    if dtype not in BOX_DTYPES:
        raise ValueError(f"config key '{key}.dtype': one of {', '.join(BOX_DTYPES)}, got {dtype!r}")
    bounds = []
    for side, default in (("low", -np.inf), ("high", np.inf)):
        value = d.get(side, default)
        try:
            b = np.asarray(_numbers(value), np.float64)
            b = b.reshape(shape) if b.ndim == 1 and b.size == int(np.prod(shape)) > 1 else np.broadcast_to(b, shape)
        except (ValueError, TypeError):
            raise ValueError(f"config key '{key}.{side}': a number or a list shaped {shape} (or flat), "
                             f"got {str(value)[:60]}") from None
        if np.isnan(b).any():
            raise ValueError(f"config key '{key}.{side}': NaN is no bound")
        bounds.append(b)
    low, high = bounds
    if not np.all(low <= high):
        raise ValueError(f"config key '{key}': low must not exceed high")
    if np.dtype(dtype).kind in "iub" and not (np.isfinite(low).all() and np.isfinite(high).all()):
        info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
        low = np.where(np.isfinite(low), low, info.min if info else 0)
        high = np.where(np.isfinite(high), high, info.max if info else 1)
    return spaces.Box(low.astype(dtype), high.astype(dtype), tuple(shape), np.dtype(dtype))


READERS = {"discrete": _discrete, "box": _box, "multi_discrete": _multi_discrete, "multi_binary": _multi_binary,
           "dict": _dict, "tuple": _tuple}


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_array(value, key: str) -> np.ndarray:
    """An integer or a (nested, rectangular) list of them as an int64 array."""
    try:
        a = np.asarray(value)
    except ValueError:
        a = np.asarray(None)
    if a.dtype.kind not in "iu":
        raise ValueError(f"config key '{key}': an integer or a (nested) list of integers, got {str(value)[:60]}")
    return a.astype(np.int64)


def _numbers(value):
    """A bound with the wire's "inf" / "-inf" strings read as numbers."""
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and value in ("inf", "-inf", "+inf"):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(value)
    return value


def space_to_data(space) -> dict:
    """A space (a leaf, or a Dict or Tuple of them) as plain data, JSON-safe (infinite bounds as strings);
    Box and Discrete from 0 exactly as protocol 1 wrote them."""
    if isinstance(space, spaces.Dict):
        return {"type": "dict", "spaces": {k: space_to_data(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "tuple", "spaces": [space_to_data(s) for s in space.spaces]}
    if isinstance(space, spaces.Discrete):
        return {"type": "discrete", "n": int(space.n), **({"start": int(space.start)} if space.start else {})}
    if isinstance(space, spaces.MultiDiscrete):
        start = np.asarray(space.start)
        return {"type": "multi_discrete", "nvec": space.nvec.tolist(), "dtype": np.dtype(space.dtype).name,
                **({"start": start.tolist()} if start.any() else {})}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "multi_binary", "n": int(space.n) if len(space.shape) == 1 else list(space.shape)}

    def bound(a):
        """One number when every element has it (a frame's 0 and 255), else the flat list."""
        values = [v if np.isfinite(v) else ("inf" if v > 0 else "-inf") for v in np.asarray(a, np.float64).ravel().tolist()]
        return values[0] if len(set(values)) == 1 else values
    return {"type": "box", "shape": list(space.shape), "dtype": np.dtype(space.dtype).name,
            "low": bound(space.low), "high": bound(space.high)}


def same_space(a, b, bounds: bool) -> bool:
    """Declared and actual spaces agree: kind, structure (a Dict's keys, a Tuple's length), each leaf's size,
    shape and dtype, and with `bounds` a Box's bounds too (an action space's: they scale the actions; an
    observation space's are no input to the network)."""
    if _kind(a) is not _kind(b):
        return False
    if isinstance(a, spaces.Dict):
        return set(a.spaces) == set(b.spaces) and all(same_space(a[k], b[k], bounds) for k in a.spaces)
    if isinstance(a, spaces.Tuple):
        return len(a.spaces) == len(b.spaces) and all(same_space(x, y, bounds) for x, y in zip(a.spaces, b.spaces))
    if isinstance(a, spaces.Discrete):
        return a.n == b.n and a.start == b.start
    if isinstance(a, spaces.MultiDiscrete):
        return (np.array_equal(a.nvec, b.nvec) and np.array_equal(a.start, b.start)
                and np.dtype(a.dtype) == np.dtype(b.dtype))
    if isinstance(a, spaces.MultiBinary):
        return a.shape == b.shape
    return (a.shape == b.shape and a.dtype == b.dtype
            and (not bounds or (np.array_equal(a.low, b.low) and np.array_equal(a.high, b.high))))


KINDS = (spaces.Dict, spaces.Tuple, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Box)


def _kind(space) -> type:
    return next((cls for cls in KINDS if isinstance(space, cls)), type(space))


def mask_problem(observation_space, action_space) -> str | None:
    """What is wrong with an observation's `action_mask` leaf (`distrl.tree.MASK_KEY`) for `action_space`, or
    None (none, or one entry per logit: a MultiBinary of `mask_size` entries)."""
    if not tree.has_mask(observation_space):
        return None
    size, mask = mask_size(action_space), observation_space[tree.MASK_KEY]
    if size is None:
        return f"an {tree.MASK_KEY!r} leaf masks Discrete, MultiDiscrete or MultiBinary actions, not {action_space}"
    if not isinstance(mask, spaces.MultiBinary) or mask.shape != (size,):
        return (f"its {tree.MASK_KEY!r} leaf is {mask}, where {action_space} actions take a multi_binary of "
                f"{size} (one entry per choice, each factor's after the other)")
    return None
