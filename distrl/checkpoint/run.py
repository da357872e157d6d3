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

import os
import shutil
import tempfile
from collections import OrderedDict
from typing import Any

import torch

from distrl.checkpoint.files import CheckpointError, atomic_write
from distrl.checkpoint.layout import (DONE, FORMAT_VERSION, LEARNER, META, STATE, TMP_PREFIX, ckpt_dirs, fsync_dir,
                                      json_bytes, sha256)
from distrl.checkpoint.read import checkpoint_size, latest_checkpoint, load_latest, read_checkpoint
from distrl.checkpoint.rng import capture_global_rng, numpy_rng_to_json, restore_global_rng
# The store file's writer lives apart so the replay server can write one without importing torch.
from distrl.checkpoint.store_file import save_store, write_arrays
from distrl.checkpoint.store_file import check_json_exact as _check_json_exact
from distrl.checkpoint.store_file import split_store as _split_store
from distrl.checkpoint.store_file import write_file as _write_file
from distrl.version import __version__

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


# ------------------------------------------------------------------------ write
def _validated_meta(state: dict[str, Any]) -> dict[str, Any]:
    """The meta to write, after checking every part of `state` can be written and read back as it is."""
    missing = {"meta", "learner", "store", "workers", "torch_rng", "numpy_rng"} - set(state)
    if missing:
        raise KeyError(f"checkpoint state lacks {sorted(missing)}")
    meta = dict(state["meta"], format_version=FORMAT_VERSION, distrl_version=__version__)
    _check_json_exact(meta, "state['meta']")
    _check_json_exact(state["workers"], "state['workers']")
    if type(state["workers"]) is not list:
        raise TypeError("state['workers'] must be a list")
    _check_torch_safe(state["learner"], "state['learner']")
    if state["torch_rng"] is not None and not isinstance(state["torch_rng"], torch.Tensor):
        raise TypeError("state['torch_rng'] must be a tensor or None")
    return meta


def write_checkpoint(run_dir: str, state: dict[str, Any], keep: int = 3, files: dict[str, bytes] | None = None) -> str:
    """Write ``RUN_DIR/checkpoints/ckpt-<N>/`` atomically, prune to `keep`, return its path.

    `files` are extra files (name -> bytes) written into it and listed in DONE, e.g. config.yaml.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    meta = _validated_meta(state)  # everything is checked before any file exists: a bad state leaves no trace
    writer = state["store"] if callable(state["store"]) else None
    # Split (and so validate) a store given as data before any file exists.
    skel, arrays = (None, {}) if writer is not None or state["store"] is None else _split_store(state["store"])

    root = os.path.join(run_dir, "checkpoints")
    os.makedirs(root, exist_ok=True)
    existing = ckpt_dirs(root)
    n = existing[-1][0] + 1 if existing else 1
    final = os.path.join(root, f"ckpt-{n:08d}")
    tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{n:08d}-", dir=root)
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
        for name, data in (files or {}).items():
            _write_file(os.path.join(tmp, name), lambda fh, data=data: fh.write(data))
        _write_file(os.path.join(tmp, META), lambda fh: fh.write(json_bytes(meta)))
        _write_file(os.path.join(tmp, STATE), lambda fh: fh.write(json_bytes(small)))
        _write_file(os.path.join(tmp, LEARNER),
                    lambda fh: torch.save({"learner": state["learner"],
                                           "torch_rng": state["torch_rng"]}, fh))
        files = {name: {"size": os.path.getsize(os.path.join(tmp, name)),
                        "sha256": sha256(os.path.join(tmp, name))}
                 for name in sorted(os.listdir(tmp))}
        fsync_dir(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(root)
    # DONE last: a kill anywhere above leaves a dir that readers skip.
    done = json_bytes({"format_version": FORMAT_VERSION, "files": files})
    atomic_write(os.path.join(final, DONE), lambda p: _write_file(p, lambda fh: fh.write(done)))
    fsync_dir(final)
    _prune(root, keep)
    return final


def _prune(root: str, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; drop everything else we own."""
    dirs = ckpt_dirs(root)
    complete = [p for _, p in dirs if os.path.isfile(os.path.join(p, DONE))]
    kept = set(complete[-keep:])
    for _, p in dirs:
        if p not in kept:
            shutil.rmtree(p, ignore_errors=True)
    for name in os.listdir(root):
        if name.startswith(TMP_PREFIX):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


