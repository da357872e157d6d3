"""What every role's actor has: its peers by name, a tracer labelled with its Ray node, and a heartbeat
the driver takes every second (`pid`), answered on a thread of its own. A role is an actor class made with
`role_actor` that derives from `Traced`: it has all of these without a line of its own."""
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


# Roles answer `pid` (the driver's heartbeat, `distrl.runtime.watch`) on a thread of its own, so a role busy
# in a long call (an evaluation, a big checkpoint, a slow env step) still answers, and only a stopped, frozen
# or lost process goes silent.
HEALTH = {"health": 1}


def role_actor(concurrency_groups: dict | None = None, **options):
    """`ray.remote` for a role's actor class (a `Traced`): its heartbeat's thread (the "health" concurrency
    group) besides `concurrency_groups`, and no per-call task events (Ray would record and ship one to the GCS
    per call, hundreds a second here, for a dashboard that is not running)."""
    return ray.remote(enable_task_events=False, concurrency_groups={**(concurrency_groups or {}), **HEALTH},
                      **options)


class Traced:
    """Lets the driver collect what this actor recorded and check that its process answers."""

    @ray.method(concurrency_group="health")  # a role busy in a long call (an update) still hands its events over
    def drain_trace(self) -> dict:
        return tracer().drain()

    @ray.method(concurrency_group="health")
    def pid(self) -> int:
        return os.getpid()
