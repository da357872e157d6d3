"""Algorithm registry: name -> module path, imported only when used."""
from __future__ import annotations

import importlib

ALGOS: dict[str, str] = {
    "apex_dqn": "distrl.algos.apex_dqn",
    "sac": "distrl.algos.sac",
    "a2c": "distrl.algos.a2c",
    "a3c": "distrl.algos.a3c",
    "ppo": "distrl.algos.ppo",
    "impala": "distrl.algos.impala",
}


def get_algorithm_class(name: str):
    """The `Algorithm` subclass registered under `name`."""
    return importlib.import_module(ALGOS[name]).ALGORITHM
