"""Spaces declared as plain data: in a config (`external.observation_space`) and on the simulator protocol.

    {type: discrete, n: 2}
    {type: box, shape: [4], dtype: float32, low: -.inf, high: .inf}     # low, high: a number or a list

On the wire (JSON has no infinity) an infinite bound is the string "inf" or "-inf", and a bound is one
number when all its elements are equal, else a flat list (C order).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

BOX_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool")


def space_from_data(d, key: str):
    """The space `d` declares; ValueError naming `key` and what is wrong."""
    if not isinstance(d, dict):
        raise ValueError(f"config key '{key}': expected a mapping like {{type: discrete, n: 2}}, got {d!r}")
    kind = d.get("type", "discrete" if "n" in d else "box")
    known = {"discrete": {"type", "n"}, "box": {"type", "shape", "dtype", "low", "high"}}
    if kind not in known:
        raise ValueError(f"config key '{key}.type': discrete or box, got {kind!r}")
    extra = set(d) - known[kind]
    if extra:
        raise ValueError(f"config key '{key}': a {kind} space takes {sorted(known[kind] - {'type'})}, not {sorted(extra)}")
    if kind == "discrete":
        n = d.get("n")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"config key '{key}.n': a positive integer, got {n!r}")
        return spaces.Discrete(n)
    return _box(d, key)


def _box(d: dict, key: str) -> spaces.Box:
    shape, dtype = d.get("shape"), d.get("dtype", "float32")
    if not isinstance(shape, list) or not shape or not all(isinstance(n, int) and n > 0 for n in shape):
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
    """A Discrete or Box space as plain data (JSON-safe: infinite bounds as strings)."""
    if isinstance(space, spaces.Discrete):
        return {"type": "discrete", "n": int(space.n)}
    def bound(a):
        """One number when every element has it (a frame's 0 and 255), else the flat list."""
        values = [v if np.isfinite(v) else ("inf" if v > 0 else "-inf") for v in np.asarray(a, np.float64).ravel().tolist()]
        return values[0] if len(set(values)) == 1 else values
    return {"type": "box", "shape": list(space.shape), "dtype": np.dtype(space.dtype).name,
            "low": bound(space.low), "high": bound(space.high)}


def same_space(a, b, bounds: bool) -> bool:
    """Declared and actual spaces agree: kind, size, shape, dtype, and with `bounds` a Box's bounds too (an
    action space's: they scale the actions; an observation space's are no input to the network)."""
    if isinstance(a, spaces.Discrete) or isinstance(b, spaces.Discrete):
        return isinstance(a, spaces.Discrete) and isinstance(b, spaces.Discrete) and a.n == b.n
    return (isinstance(a, spaces.Box) and isinstance(b, spaces.Box) and a.shape == b.shape and a.dtype == b.dtype
            and (not bounds or (np.array_equal(a.low, b.low) and np.array_equal(a.high, b.high))))
