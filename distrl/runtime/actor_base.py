"""What every role's actor has: its peers by name, a tracer labelled with its Ray node, and a health
check the driver calls (`pid`)."""
from __future__ import annotations

import os

import ray

from distrl.observe.trace import configure, tracer


def peer(actor):
    """An actor handle from its name (a handle is taken as it is)."""
    return ray.get_actor(actor) if isinstance(actor, str) else actor


def start_tracing(trace: tuple[bool, int], role: str, index: int | None = None) -> None:
    """This actor's tracer: (enabled, ring size) from the config, labelled with its role and Ray node."""
    enabled, capacity = trace
    configure(role, index, enabled, capacity, node=ray.get_runtime_context().get_node_id()[:8])


# Roles answer `pid` (the driver's health check) on a thread of its own, so a role busy in a long call
# (an evaluation, a big checkpoint) still answers, and only a stopped or lost process goes silent.
HEALTH = {"health": 1}


class Traced:
    """Lets the driver collect what this actor recorded and check that its process answers."""

    def drain_trace(self) -> dict:
        return tracer().drain()

    @ray.method(concurrency_group="health")
    def pid(self) -> int:
        return os.getpid()
