"""Reading whole-run checkpoints back: verification, the newest good one, the state as it was written."""
from __future__ import annotations

import json
import os
import sys
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from distrl.checkpoint.files import CheckpointError
from distrl.checkpoint.layout import DONE, FORMAT_VERSION, LEARNER, META, STATE, ckpt_dirs, done_problem, one_line, sha256
from distrl.checkpoint.rng import numpy_rng_from_json
from distrl.checkpoint.store_file import ARRAY_KEY as _ARRAY
from distrl.checkpoint.store_file import STORE


def _join_store(skel: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    if type(skel) is dict:
        if _ARRAY in skel:
            name = skel[_ARRAY]
            if name not in arrays:
                raise CheckpointError(f"checkpoint file {path} is corrupt: array {name!r} is missing")
            a = arrays[name]
            return a[()] if skel.get("scalar") else a
        return {k: _join_store(v, arrays, path) for k, v in skel.items()}
    if type(skel) is list:
        return [_join_store(v, arrays, path) for v in skel]
    return skel


def latest_checkpoint(run_dir: str) -> str | None:
    """Newest ``ckpt-*`` dir with a valid DONE marker; incomplete ones warn and are skipped."""
    for _, path in reversed(ckpt_dirs(os.path.join(run_dir, "checkpoints"))):
        problem = done_problem(path)
        if problem is None:
            return path
        warnings.warn(f"skipping incomplete checkpoint {path}: {problem}", RuntimeWarning, stacklevel=2)
    return None


def _fail(path: str, what: str) -> CheckpointError:
    return CheckpointError(f"checkpoint file {path} {what}")


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, ValueError) as e:
        raise _fail(path, f"is corrupt: {one_line(e)}") from None


def _verify(path: str) -> dict[str, Any]:
    """Check DONE and every file it lists (size, sha256); return the parsed DONE."""
    done_path = os.path.join(path, DONE)
    if not os.path.isfile(done_path):
        raise _fail(done_path, "is missing: the checkpoint is incomplete")
    done = _read_json(done_path)
    if (type(done) is not dict or type(done.get("files")) is not dict
            or type(done.get("format_version")) is not int):
        raise _fail(done_path, "is corrupt: expected {'format_version': int, 'files': {...}}")
    if done["format_version"] > FORMAT_VERSION:
        raise _fail(done_path, f"has format_version {done['format_version']}, newer than the "
                               f"{FORMAT_VERSION} this distrl reads: upgrade distrl")
    for name in (META, STATE, LEARNER):
        if name not in done["files"]:
            raise _fail(done_path, f"is corrupt: it does not list {name}")
    for name, info in done["files"].items():
        f = os.path.join(path, name)
        if os.path.basename(name) != name or not isinstance(info, dict):
            raise _fail(done_path, f"is corrupt: bad entry {name!r}")
        if not os.path.isfile(f):
            raise _fail(f, "is missing")
        size = os.path.getsize(f)
        if size != info.get("size"):
            raise _fail(f, f"is truncated or altered: {size} bytes, expected {info.get('size')}")
        if sha256(f) != info.get("sha256"):
            raise _fail(f, "is corrupt: sha256 mismatch")
    return done


def _check_version(path: str, meta: Any) -> None:
    if type(meta) is not dict:
        raise _fail(path, "is corrupt: expected a JSON object")
    v = meta.get("format_version")
    if type(v) is not int:
        raise _fail(path, f"has no valid format_version (found {v!r}); "
                          f"this distrl reads format_version {FORMAT_VERSION}")
    if v > FORMAT_VERSION:
        raise _fail(path, f"has format_version {v} (distrl {meta.get('distrl_version')}), newer than "
                          f"the {FORMAT_VERSION} this distrl reads: upgrade distrl")
    if v < FORMAT_VERSION:
        # Format 1 named its networks' parameters differently and held every algorithm's config section.
        raise _fail(path, f"has format_version {v}, older than the {FORMAT_VERSION} this distrl reads, and no "
                          f"migration exists: resume it with the distrl that wrote it ({meta.get('distrl_version')})")


def _opened(path: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(absolute path, DONE, meta) of a checkpoint dir whose files all verify and whose format this distrl reads."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise _fail(path, "is missing: no such checkpoint directory")
    done = _verify(path)
    meta_path = os.path.join(path, META)
    meta = _read_json(meta_path)
    _check_version(meta_path, meta)
    return path, done, meta


def _load_learner(path: str) -> dict[str, Any]:
    """The checkpoint's learner.pt: {"learner": the learner loop's state, "torch_rng"}."""
    learner_path = os.path.join(path, LEARNER)
    try:
        # weights_only refuses anything but tensors and plain containers: no code runs on load.
        blob = torch.load(learner_path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for bad zips and forbidden globals
        raise _fail(learner_path, f"is corrupt or unsafe: {one_line(e)}") from None
    if type(blob) not in (dict, OrderedDict) or set(blob) != {"learner", "torch_rng"}:
        raise _fail(learner_path, "is corrupt: expected {'learner', 'torch_rng'}")
    return blob


def read_learner(path: str) -> dict[str, Any]:
    """Verify a checkpoint and load its learner's state alone (not the replay's store): {"state",
    "torch_rng", "version", "statistics"} as the learner loop saved it."""
    path, _, _ = _opened(path)
    return _load_learner(path)["learner"]


def read_checkpoint(path: str) -> dict[str, Any]:
    """Verify and load a checkpoint dir back into the structure given to write_checkpoint."""
    path, done, meta = _opened(path)

    state_path = os.path.join(path, STATE)
    small = _read_json(state_path)
    if type(small) is not dict or not {"workers", "numpy_rng", "store"} <= set(small) \
            or type(small["workers"]) is not list:
        raise _fail(state_path, "is corrupt: expected keys workers, numpy_rng, store")
    try:
        numpy_rng = numpy_rng_from_json(small["numpy_rng"])
    except (KeyError, TypeError, ValueError) as e:
        raise _fail(state_path, f"is corrupt: bad numpy_rng ({one_line(e)})") from None

    blob = _load_learner(path)
    store = None
    if small["store"] is not None:
        store_path = os.path.join(path, STORE)
        if STORE not in done["files"]:
            raise _fail(os.path.join(path, DONE), f"is corrupt: it does not list {STORE}")
        try:
            with np.load(store_path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except Exception as e:  # BadZipFile, ValueError for object arrays, OSError, ...
            raise _fail(store_path, f"is corrupt or unsafe: {one_line(e)}") from None
        store = _join_store(small["store"], arrays, store_path)

    return {"meta": meta, "learner": blob["learner"], "store": store, "workers": small["workers"],
            "torch_rng": blob["torch_rng"], "numpy_rng": numpy_rng}


def checkpoint_size(path: str) -> int:
    """Bytes of all files under a checkpoint dir."""
    total = 0
    for d, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
    return total


def load_latest(run_dir: str, read=read_checkpoint) -> tuple[str, Any]:
    """(path, `read(path)`) of the newest checkpoint that is complete and verifies.

    An incomplete one is skipped, and one that fails verification (tampered, truncated) falls back
    to the next older, each with a one-line warning; CheckpointError when none is left.
    """
    skipped: list[str] = []  # why each newer one was passed over: said once a usable one is found
    for _, path in reversed(ckpt_dirs(os.path.join(run_dir, "checkpoints"))):
        problem = done_problem(path)
        if problem is not None:
            skipped.append(f"skipping incomplete checkpoint {path}: {problem}")
            continue
        try:
            state = read(path)
        except CheckpointError as e:
            skipped.append(f"{e}")
            continue
        for reason in skipped:
            print(f"distrl: warning: {reason}; falling back to {path}", file=sys.stderr)
        return path, state
    where = os.path.join(run_dir, "checkpoints")
    raise CheckpointError(f"no usable checkpoint in {where}" + (f" ({skipped[0]})" if skipped else ""))
