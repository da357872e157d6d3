"""Whole-run checkpoints: everything needed to resume a run exactly where it stopped.

The caller assembles ``state`` (a dict with exactly these keys) and gets the same
structure back from :func:`read_checkpoint`:

- ``"meta"``: JSON-exact dict (counters, parameter-server version, config as a
  plain dict, ``"python_rng"`` from :func:`capture_global_rng`, ...). On write
  ``"format_version"`` and ``"distrl_version"`` are added (and read back).
- ``"learner"``: ``Learner.state_dict()`` -- tensors, module/optimizer state
  dicts, tuples, python scalars. Loaded back with ``weights_only=True`` on CPU.
- ``"store"``: the experience store's ``state_dict()`` or None, or a callable
  ``writer(directory) -> (skeleton, meta_extra) | None`` that writes store.npz
  itself with :func:`save_store` (the replay server, so a big replay is not
  copied through Ray's object store); ``meta_extra`` is merged into meta. Any nesting of
  str-keyed dicts and lists whose leaves are numpy arrays, numpy scalars or
  python int/float/bool/str/None (ReplayBuffer's flat dict, FragmentQueue's
  ``{"items": [{...}, ...], "added": int, "taken": int}``).
- ``"workers"``: list of JSON-exact dicts (big python ints are fine).
- ``"torch_rng"``: ``torch.get_rng_state()`` (uint8 tensor) or None.
- ``"numpy_rng"``: ``np.random.get_state()`` tuple or None.

"JSON-exact" means dict (str keys), list, str, int, float, bool, None, nothing
else -- a tuple or numpy scalar would silently come back as a different type,
so writing one raises TypeError naming where it is.

:func:`capture_global_rng` returns ``{"python_rng": [3, [625 ints], None|float],
"numpy_rng": <get_state tuple>, "torch_rng": <uint8 tensor>}``; put
``python_rng`` in ``state["meta"]`` and the other two at top level, and call
:func:`restore_global_rng` on the read-back state (or on the capture dict).

On disk (one writer per run dir)::

    RUN_DIR/checkpoints/ckpt-00000007/
        meta.json     state["meta"] + format_version + distrl_version
        state.json    {"workers": [...], "numpy_rng": {...}|null, "store": skeleton|null}
        learner.pt    torch.save({"learner": ..., "torch_rng": ...})
        store.npz     uncompressed arrays of the store (only if store is not None)
        DONE          {"format_version": 1, "files": {name: {"size", "sha256"}}}, written last

The store skeleton is the store with each array replaced by
``{"__ndarray__": member}`` (plus ``"scalar": true`` for numpy scalars), where
member is the array's path such as ``"items/0/obs"`` inside store.npz.
"""
from __future__ import annotations

import hashlib
import json
import os

import re
import shutil
import tempfile
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from distrl.checkpoint.files import CheckpointError, atomic_write
from distrl.checkpoint.rng import capture_global_rng, numpy_rng_from_json, numpy_rng_to_json, restore_global_rng
# The store file's writer lives apart so the replay server can write one without importing torch.
from distrl.checkpoint.store_file import ARRAY_KEY as _ARRAY
from distrl.checkpoint.store_file import STORE, save_store, write_arrays
from distrl.checkpoint.store_file import check_json_exact as _check_json_exact
from distrl.checkpoint.store_file import split_store as _split_store
from distrl.checkpoint.store_file import write_file as _write_file
from distrl.version import __version__

FORMAT_VERSION = 1
DONE = "DONE"
META, STATE, LEARNER = "meta.json", "state.json", "learner.pt"
_CKPT_RE = re.compile(r"^ckpt-(\d{8,})$")
_TMP_PREFIX = ".tmp-ckpt-"

__all__ = [
    "CheckpointError", "FORMAT_VERSION", "capture_global_rng", "checkpoint_size", "latest_checkpoint",
    "load_latest", "read_checkpoint", "restore_global_rng", "save_store", "write_checkpoint",
]


# ------------------------------------------------------------------- validation
# Types torch.load(weights_only=True) gives back as they went in.
_TORCH_LEAVES = (torch.Tensor, bool, int, float, complex, str, bytes, type(None),
                 torch.dtype, torch.device, torch.Size)


def _check_torch_safe(x: Any, where: str) -> None:
    if isinstance(x, _TORCH_LEAVES):
        return
    if type(x) in (dict, OrderedDict):
        for k, v in x.items():
            _check_torch_safe(v, f"{where}[{k!r}]")
        return
    if type(x) in (list, tuple):
        for i, v in enumerate(x):
            _check_torch_safe(v, f"{where}[{i}]")
        return
    raise TypeError(f"{where}: {type(x).__name__} cannot be loaded with torch.load(weights_only=True)")


# ---------------------------------------------------------------- store skeleton
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


# ------------------------------------------------------------------ file helpers
def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse directory fsync; the rename itself is still atomic
    finally:
        os.close(fd)


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _one_line(e: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    # torch buries the reason after paragraphs of advice; keep just the reason.
    m = re.search(r"WeightsUnpickler error: ([^\n]*)", text)
    if m:
        text = "refused by weights_only: " + m.group(1).split(" Please ")[0].rstrip(".")
    elif "PytorchStreamReader" in text:
        text = text.split(". ")[0]
    msg = " ".join(f"{type(e).__name__}: {text}".split())
    return msg if len(msg) <= 300 else msg[:297] + "..."


def _ckpt_dirs(root: str) -> list[tuple[int, str]]:
    """(number, path) of every ``ckpt-N`` dir under `root`, oldest first."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _CKPT_RE.match(name)
        if m and os.path.isdir(os.path.join(root, name)):
            out.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(out)


def _done_problem(path: str) -> str | None:
    """Cheap completeness check (DONE parses, listed files have their sizes); None if fine."""
    done = os.path.join(path, DONE)
    if not os.path.isfile(done):
        return "no DONE marker (interrupted while writing?)"
    try:
        with open(done) as fh:
            files = json.load(fh)["files"]
        for name, info in files.items():
            if os.path.getsize(os.path.join(path, name)) != info["size"]:
                return f"{name} has the wrong size"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable DONE or missing file ({_one_line(e)})"
    return None


# ------------------------------------------------------------------------ write
def write_checkpoint(run_dir: str, state: dict[str, Any], keep: int = 3) -> str:
    """Write ``RUN_DIR/checkpoints/ckpt-<N>/`` atomically, prune to `keep`, return its path."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    missing = {"meta", "learner", "store", "workers", "torch_rng", "numpy_rng"} - set(state)
    if missing:
        raise KeyError(f"checkpoint state lacks {sorted(missing)}")
    # Validate everything before creating files so a bad state leaves no trace.
    meta = dict(state["meta"], format_version=FORMAT_VERSION, distrl_version=__version__)
    _check_json_exact(meta, "state['meta']")
    _check_json_exact(state["workers"], "state['workers']")
    if type(state["workers"]) is not list:
        raise TypeError("state['workers'] must be a list")
    _check_torch_safe(state["learner"], "state['learner']")
    if state["torch_rng"] is not None and not isinstance(state["torch_rng"], torch.Tensor):
        raise TypeError("state['torch_rng'] must be a tensor or None")
    writer = state["store"] if callable(state["store"]) else None
    # Split (and so validate) a store given as data before any file exists.
    skel, arrays = (None, {}) if writer is not None or state["store"] is None else _split_store(state["store"])

    root = os.path.join(run_dir, "checkpoints")
    os.makedirs(root, exist_ok=True)
    existing = _ckpt_dirs(root)
    n = existing[-1][0] + 1 if existing else 1
    final = os.path.join(root, f"ckpt-{n:08d}")
    tmp = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{n:08d}-", dir=root)
    try:
        if writer is not None:
            written = writer(tmp)
            skel, extra = written if written is not None else (None, {})
            meta.update(extra)
            _check_json_exact(meta, "state['meta']")
        elif skel is not None:
            write_arrays(tmp, arrays)
        small = {"workers": state["workers"], "numpy_rng": numpy_rng_to_json(state["numpy_rng"]),
                 "store": skel}
        _write_file(os.path.join(tmp, META), lambda fh: fh.write(_json_bytes(meta)))
        _write_file(os.path.join(tmp, STATE), lambda fh: fh.write(_json_bytes(small)))
        _write_file(os.path.join(tmp, LEARNER),
                    lambda fh: torch.save({"learner": state["learner"],
                                           "torch_rng": state["torch_rng"]}, fh))
        files = {name: {"size": os.path.getsize(os.path.join(tmp, name)),
                        "sha256": _sha256(os.path.join(tmp, name))}
                 for name in sorted(os.listdir(tmp))}
        _fsync_dir(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(root)
    # DONE last: a kill anywhere above leaves a dir that readers skip.
    done = _json_bytes({"format_version": FORMAT_VERSION, "files": files})
    atomic_write(os.path.join(final, DONE), lambda p: _write_file(p, lambda fh: fh.write(done)))
    _fsync_dir(final)
    _prune(root, keep)
    return final


def _prune(root: str, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; drop everything else we own."""
    dirs = _ckpt_dirs(root)
    complete = [p for _, p in dirs if os.path.isfile(os.path.join(p, DONE))]
    kept = set(complete[-keep:])
    for _, p in dirs:
        if p not in kept:
            shutil.rmtree(p, ignore_errors=True)
    for name in os.listdir(root):
        if name.startswith(_TMP_PREFIX):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


# ------------------------------------------------------------------------- read
def latest_checkpoint(run_dir: str) -> str | None:
    """Newest ``ckpt-*`` dir with a valid DONE marker; incomplete ones warn and are skipped."""
    for _, path in reversed(_ckpt_dirs(os.path.join(run_dir, "checkpoints"))):
        problem = _done_problem(path)
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
        raise _fail(path, f"is corrupt: {_one_line(e)}") from None


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
        if _sha256(f) != info.get("sha256"):
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
        # No older formats exist yet; a migration would go here.
        raise _fail(path, f"has format_version {v}, older than the supported "
                          f"{FORMAT_VERSION}, and no migration exists")


def read_checkpoint(path: str) -> dict[str, Any]:
    """Verify and load a checkpoint dir back into the structure given to write_checkpoint."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise _fail(path, "is missing: no such checkpoint directory")
    done = _verify(path)

    meta_path = os.path.join(path, META)
    meta = _read_json(meta_path)
    _check_version(meta_path, meta)

    state_path = os.path.join(path, STATE)
    small = _read_json(state_path)
    if type(small) is not dict or not {"workers", "numpy_rng", "store"} <= set(small) \
            or type(small["workers"]) is not list:
        raise _fail(state_path, "is corrupt: expected keys workers, numpy_rng, store")
    try:
        numpy_rng = numpy_rng_from_json(small["numpy_rng"])
    except (KeyError, TypeError, ValueError) as e:
        raise _fail(state_path, f"is corrupt: bad numpy_rng ({_one_line(e)})") from None

    learner_path = os.path.join(path, LEARNER)
    try:
        # weights_only refuses anything but tensors and plain containers: no code runs on load.
        blob = torch.load(learner_path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for bad zips and forbidden globals
        raise _fail(learner_path, f"is corrupt or unsafe: {_one_line(e)}") from None
    if type(blob) not in (dict, OrderedDict) or set(blob) != {"learner", "torch_rng"}:
        raise _fail(learner_path, "is corrupt: expected {'learner', 'torch_rng'}")

    store = None
    if small["store"] is not None:
        store_path = os.path.join(path, STORE)
        if STORE not in done["files"]:
            raise _fail(os.path.join(path, DONE), f"is corrupt: it does not list {STORE}")
        try:
            with np.load(store_path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except Exception as e:  # BadZipFile, ValueError for object arrays, OSError, ...
            raise _fail(store_path, f"is corrupt or unsafe: {_one_line(e)}") from None
        store = _join_store(small["store"], arrays, store_path)

    return {"meta": meta, "learner": blob["learner"], "store": store, "workers": small["workers"],
            "torch_rng": blob["torch_rng"], "numpy_rng": numpy_rng}


def checkpoint_size(path: str) -> int:
    """Bytes of all files under a checkpoint dir."""
    total = 0
    for d, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
    return total


def load_latest(run_dir: str) -> tuple[str, dict[str, Any]]:
    """(path, state) of the newest complete checkpoint; CheckpointError if there is none."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = latest_checkpoint(run_dir)
    for w in caught:  # incomplete checkpoints are skipped: say so on one line each
        print(f"distrl: warning: {w.message}")
    if path is None:
        raise CheckpointError(f"no complete checkpoint in {os.path.join(run_dir, 'checkpoints')}")
    return path, read_checkpoint(path)
