"""Global RNG states (python `random`, numpy's legacy generator, torch) as checkpoint data."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def python_rng_to_json(st: tuple) -> list:
    """``random.getstate()`` as ``[version, [ints], gauss_next]``."""
    return [st[0], list(st[1]), st[2]]


def python_rng_from_json(js: list) -> tuple:
    return (int(js[0]), tuple(int(x) for x in js[1]), js[2])


def numpy_rng_to_json(st: tuple | None) -> dict | None:
    """Legacy ``np.random.get_state()`` tuple as a JSON-exact dict."""
    if st is None:
        return None
    name, key, pos, has_gauss, gauss = st
    return {"bit_generator": str(name), "key": np.asarray(key, dtype=np.uint32).tolist(),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(gauss)}


def numpy_rng_from_json(js: dict | None) -> tuple | None:
    if js is None:
        return None
    return (str(js["bit_generator"]), np.asarray(js["key"], dtype=np.uint32),
            int(js["pos"]), int(js["has_gauss"]), float(js["cached_gaussian"]))


def capture_global_rng() -> dict[str, Any]:
    """Global RNG states of python ``random``, numpy's legacy generator and torch."""
    return {"python_rng": python_rng_to_json(random.getstate()),
            "numpy_rng": np.random.get_state(), "torch_rng": torch.get_rng_state()}


def restore_global_rng(d: dict[str, Any]) -> None:
    """Restore from a :func:`capture_global_rng` dict or a read-back checkpoint state.

    Parts that are absent or None are left alone.
    """
    py = d.get("python_rng", (d.get("meta") or {}).get("python_rng"))
    if py is not None:
        random.setstate(python_rng_from_json(py))
    if d.get("numpy_rng") is not None:
        np.random.set_state(d["numpy_rng"])
    if d.get("torch_rng") is not None:
        torch.set_rng_state(d["torch_rng"])


