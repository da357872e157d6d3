"""Atomic, pickle-free files: weights as safetensors, metadata as JSON; fresh directory names."""
from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import time
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated or not what distrl wrote."""


def atomic_write(path: str, write) -> None:
    """Write via a temp file in the same dir, fsync, then rename over `path`."""
    d = os.path.dirname(path) or "."
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_weights(path: str, weights: dict[str, np.ndarray], meta: dict[str, Any] | None = None) -> None:
    meta_s = {"distrl": json.dumps(meta or {})}
    arrays = {k: np.ascontiguousarray(v) for k, v in weights.items()}
    atomic_write(path, lambda tmp: save_file(arrays, tmp, metadata=meta_s))


def load_weights(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file not found: {path}")
    try:
        from safetensors import safe_open

        with safe_open(path, framework="numpy") as fh:
            meta = json.loads((fh.metadata() or {}).get("distrl", "{}"))
        return load_file(path), meta
    except (SafetensorError, OSError, ValueError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint file {path} is corrupt or not a distrl checkpoint: {e}") from None


def save_json(path: str, obj: Any) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=2, default=float)
    atomic_write(path, write)


def fresh_dir(root: str, algo: str, env_id: str, *parts: str) -> str:
    """root/<algo>_<env>[_<part>...]_<local time to the microsecond>-<random>: two started together never
    share one. The env id enters as its name after any "module:" prefix, other characters as "-"."""
    env = re.sub(r"[^A-Za-z0-9_.-]+", "-", env_id.split(":")[-1])
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
    return os.path.join(root, "_".join([algo, env, *parts, stamp]) + f"-{secrets.token_hex(3)}")
