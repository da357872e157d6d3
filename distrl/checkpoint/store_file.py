"""The store file of a whole-run checkpoint: a replay's arrays as store.npz plus a JSON skeleton.

Kept free of torch so the replay server can write its own part of a checkpoint
(see `ReplayServer.write_store`) without loading torch. The format is described
in `distrl.checkpoint.run`.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

STORE = "store.npz"
ARRAY_KEY = "__ndarray__"
# np.savez takes these as its own arguments, so they can't be member names.
RESERVED_MEMBERS = {"file", "allow_pickle"}


def save_store(directory: str, store: Any) -> Any:
    """Write a store's arrays to ``directory/store.npz`` (fsynced); return its skeleton."""
    skel, arrays = split_store(store)
    write_arrays(directory, arrays)
    return skel


def write_arrays(directory: str, arrays: dict[str, np.ndarray]) -> None:
    # Uncompressed: a 1M-transition replay must save in seconds, not minutes.
    write_file(os.path.join(directory, STORE), lambda fh: np.savez(fh, **arrays))


def write_file(path: str, write) -> None:
    with open(path, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())


def check_json_exact(x: Any, where: str) -> None:
    """Raise TypeError if `x` would not come back from JSON as the same types."""
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return
    if t is list:
        for i, v in enumerate(x):
            check_json_exact(v, f"{where}[{i}]")
        return
    if t is dict:
        for k, v in x.items():
            if type(k) is not str:
                raise TypeError(f"{where}: key {k!r} is {type(k).__name__}, JSON keys must be str")
            check_json_exact(v, f"{where}[{k!r}]")
        return
    raise TypeError(f"{where}: {t.__name__} does not round-trip through JSON "
                    "(use dict/list/str/int/float/bool/None)")


def split_store(store: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """Skeleton (JSON-exact, arrays replaced by member refs) and the arrays by member name."""
    arrays: dict[str, np.ndarray] = {}
    return _split(store, "", "state['store']", arrays), arrays


# Module-level rather than a nested recursive closure: such a closure is a reference
# cycle holding `arrays`, which would keep each checkpoint's copy of the replay alive
# until the next full garbage collection.
def _split(x: Any, path: str, where: str, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)
        if a.dtype.hasobject:
            raise TypeError(f"{where}: object arrays cannot be stored without pickle")
        name, n = path or "_", 1
        while name in arrays or name in RESERVED_MEMBERS:
            name, n = f"{path}#{n}", n + 1
        arrays[name] = a
        return {ARRAY_KEY: name, "scalar": True} if isinstance(x, np.generic) else {ARRAY_KEY: name}
    if type(x) is dict:
        if ARRAY_KEY in x:
            raise TypeError(f"{where}: key {ARRAY_KEY!r} is reserved")
        out = {}
        for k, v in x.items():
            if type(k) is not str:
                raise TypeError(f"{where}: key {k!r} is {type(k).__name__}, keys must be str")
            out[k] = _split(v, f"{path}/{k}" if path else k, f"{where}[{k!r}]", arrays)
        return out
    if type(x) is list:
        return [_split(v, f"{path}/{i}" if path else str(i), f"{where}[{i}]", arrays) for i, v in enumerate(x)]
    check_json_exact(x, where)
    return x
