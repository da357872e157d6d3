"""Algorithm registry: name -> (module path, data path). Modules are imported only when used."""
from __future__ import annotations

import importlib

ALGOS: dict[str, tuple[str, str]] = {
    # data path: "replay" (off-policy, sampled), "trajectory" (FIFO, each fragment used once)
    # or "gradients" (A3C: FIFO of worker-computed gradients, applied one at a time in arrival order)
    "apex_dqn": ("distrl.algos.apex_dqn", "replay"),
    "sac": ("distrl.algos.sac", "replay"),
    "a2c": ("distrl.algos.a2c", "trajectory"),
    "a3c": ("distrl.algos.a3c", "gradients"),
    "ppo": ("distrl.algos.ppo", "trajectory"),
    "impala": ("distrl.algos.impala", "trajectory"),
}


def get_algorithm_class(name: str):
    """The `Algorithm` subclass registered under `name`."""
    return importlib.import_module(ALGOS[name][0]).ALGORITHM


def data_path(name: str) -> str:
    """Where this algorithm's experience goes, known without importing torch."""
    return ALGOS[name][1]
