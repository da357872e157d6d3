"""One compute thread per process: every role is its own process already, and on a
few cores intra-op threads only contend with the other roles.

numpy's OpenBLAS would otherwise start a thread per core that spins between calls:
in single mode it took the core the evaluator needs, and SAC's numpy update ran
~2x slower inside a training run than alone.

Where torch is loaded (the learner), denormal floats are also flushed to zero, for
torch and for numpy on this thread: Adam's moments of parameters whose gradient
is zero (dead ReLU units) decay into the denormal range, where each float op is
~6x slower (SAC's numpy Adam step: 63 -> 362 us).
"""
from __future__ import annotations

import importlib
import sys


def one_compute_thread(load_torch: bool = False) -> None:
    """Limit numpy's BLAS, and torch (if loaded, or `load_torch`), to one thread in this process;
    with torch, flush denormals."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")
    if load_torch:
        importlib.import_module("torch")
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.set_num_threads(1)
        torch.set_flush_denormal(True)  # x86 FTZ/DAZ for this thread: numpy's arithmetic here too
