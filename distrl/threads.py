"""One compute thread per process: every role is its own process already, and on a
few cores intra-op threads only contend with the other roles.

numpy's OpenBLAS would otherwise start a thread per core that spins between calls
and takes the core another role (in single mode, the evaluator) needs.
"""
from __future__ import annotations

import importlib
import sys


def one_compute_thread(load_torch: bool = False) -> None:
    """Limit numpy's BLAS, and torch (if loaded, or `load_torch`), to one thread in this process."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")
    if load_torch:
        importlib.import_module("torch")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
