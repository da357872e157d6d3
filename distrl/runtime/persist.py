"""Whole-run checkpoints from the driver's side: what goes in, and how a run resumes."""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import time
import warnings

import numpy as np

from distrl.config import to_dict

TRANSIENT = ("lags", "all_lags", "ready", "late", "learner_scalars")  # per-log-interval samples: not worth keeping


def _plain(x):
    """numpy scalars/arrays -> python, recursively: checkpoint metadata must be JSON-exact."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


def counters_to_meta(c) -> dict:
    d = _plain({k: v for k, v in dataclasses.asdict(c).items() if k not in TRANSIENT})
    d["best_eval"] = None if d["best_eval"] == -math.inf else d["best_eval"]
    return d


def counters_from_meta(cls, meta: dict):
    c = cls(**{k: v for k, v in meta.items() if k in {f.name for f in dataclasses.fields(cls)}})
    c.best_eval = -math.inf if c.best_eval is None else c.best_eval
    return c


def save(driver) -> str:
    """Checkpoint everything the run needs to continue: roles' state, counters, RNGs."""
    from distrl.run_checkpoint import capture_global_rng, write_checkpoint

    t0 = time.time()
    roles_state = driver.roles.get_state()
    store = roles_state["store"]  # the contents, or a writer that saves them in place (see RayRoles)
    if not callable(store) and store is not None and _nbytes(store) > driver.cfg.checkpoint.max_replay_bytes:
        store = None  # too big: a resumed run refills it from the workers
    rng = capture_global_rng()
    meta = {"counters": counters_to_meta(driver.c), "wall_s": time.time() - driver.start,
            "config": to_dict(driver.cfg), "python_rng": rng["python_rng"]}
    if not callable(store):  # a writer adds these itself
        meta.update(store_sha256=store_digest(store), store_saved=store is not None)
    path = write_checkpoint(driver.run_dir, {
        "meta": meta, "learner": roles_state["learner"], "store": store, "workers": roles_state["workers"],
        "torch_rng": rng["torch_rng"], "numpy_rng": rng["numpy_rng"]}, keep=driver.cfg.checkpoint.keep)
    driver.checkpoint_s.append(time.time() - t0)
    return path


def _nbytes(tree) -> int:
    if isinstance(tree, np.ndarray):
        return tree.nbytes
    if isinstance(tree, dict):
        return sum(_nbytes(v) for v in tree.values())
    if isinstance(tree, list):
        return sum(_nbytes(v) for v in tree)
    return 0


def store_digest(tree) -> str | None:
    """sha256 over the store's arrays in key order: equal digests mean equal replay contents."""
    if tree is None:
        return None
    h = hashlib.sha256()
    _digest_into(h, tree, "")
    return h.hexdigest()


def _digest_into(h, node, prefix: str) -> None:
    if isinstance(node, np.ndarray):
        h.update(prefix.encode())
        h.update(str(node.dtype).encode())
        h.update(np.ascontiguousarray(node).data)  # no bytes copy of a big array
    elif isinstance(node, dict):
        for k in sorted(node):
            _digest_into(h, node[k], f"{prefix}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _digest_into(h, v, f"{prefix}/{i}")


def load_latest(run_dir: str) -> tuple[str, dict]:
    """(path, state) of the newest complete checkpoint; CheckpointError if there is none."""
    from distrl.checkpoint import CheckpointError
    from distrl.run_checkpoint import latest_checkpoint, read_checkpoint

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = latest_checkpoint(run_dir)
    for w in caught:  # incomplete checkpoints are skipped: say so on one line each
        print(f"distrl: warning: {w.message}")
    if path is None:
        raise CheckpointError(f"no complete checkpoint in {os.path.join(run_dir, 'checkpoints')}")
    return path, read_checkpoint(path)
