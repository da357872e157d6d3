"""The algorithm table: name -> the `Algorithm` class that declares it ("module:Class", imported when used).

An algorithm says what it is on its class (`distrl.core.Algorithm`): its config section, modes,
action spaces, data path, and whether it takes central inference and gradient workers. The config
and the runtime read those from there. Adding an algorithm is one module and one line here.
"""
from __future__ import annotations

import functools
import importlib

ALGORITHMS: dict[str, str] = {
    "apex_dqn": "distrl.algos.apex_dqn:ApexDQN",
    "sac": "distrl.algos.sac:SAC",
    "r2d2": "distrl.algos.r2d2:R2D2",
    "dhc": "distrl.algos.dhc:DHC",
    "a2c": "distrl.algos.a2c:A2C",
    "a3c": "distrl.algos.a3c:A3C",
    "ppo": "distrl.algos.ppo:PPO",
    "mappo": "distrl.algos.mappo:MAPPO",
    "impala": "distrl.algos.impala:Impala",
    "bc": "distrl.algos.bc:BC",
    "cql": "distrl.algos.cql:CQL",
}


@functools.cache
def algorithm(name: str):
    """The `Algorithm` subclass registered under `name`."""
    module, cls = ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def with_capability(flag: str) -> list[str]:
    """Names of the algorithms whose class sets `flag` (e.g. "central_inference")."""
    return [name for name in ALGORITHMS if getattr(algorithm(name), flag)]


def on_policy(name: str) -> bool:
    """Each piece of data is used once, by the newest weights (trajectories and gradients)."""
    return algorithm(name).data_path in ("trajectory", "gradients")
