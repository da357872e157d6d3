"""What every role's actor has: its peers by name, a tracer labelled with its Ray node, a heartbeat the
driver takes every second (`pid`), answered on a thread of its own, and a sign of life while it starts. A
role is an actor class made with `role_actor` that derives from `Traced`: it has all of these without a
line of its own."""
from __future__ import annotations

import functools
import os
import threading

import ray
from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

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
    group) besides `concurrency_groups`, a sign of life from the first line of its constructor, and no per-call
    task events (Ray would record and ship one to the GCS per call, hundreds a second here, for a dashboard
    that is not running)."""
    def make(cls):
        cls.__init__ = _signs_of_life(cls.__init__ if cls.__init__ is not object.__init__ else _no_init)
        return ray.remote(enable_task_events=False, concurrency_groups={**(concurrency_groups or {}), **HEALTH},
                          **options)(cls)
    return make


# An actor answers no call until its constructor has returned (importing torch, building envs: seconds, more on
# a loaded machine), so until then its process says it is alive in Ray's key-value store instead, read by the
# driver's heartbeats (`distrl.runtime.heartbeat`): a process stopped or frozen while it starts is found as soon
# as one stopped later. Its first heartbeat answered ends it.
LIFE_KEY = "distrl-life:{}"  # an actor id's sign of life: b"PID NODE_ID COUNT"
LIFE_S = 1.0
_answered = threading.Event()


def _no_init(self) -> None:
    """A role class with no constructor of its own (object's is not a Python function Ray can wrap)."""


def _signs_of_life(init):
    @functools.wraps(init)
    def starting(self, *args, **kwargs):
        context = ray.get_runtime_context()
        key = LIFE_KEY.format(context.get_actor_id()).encode()
        me = f"{os.getpid()} {context.get_node_id()}"
        threading.Thread(target=_say_alive, args=(key, me), name="distrl-sign-of-life", daemon=True).start()
        init(self, *args, **kwargs)
    return starting


def _say_alive(key: bytes, me: str) -> None:
    count = 0
    while not _answered.is_set():
        count += 1
        try:
            _internal_kv_put(key, f"{me} {count}".encode(), overwrite=True)
        except Exception:  # noqa: BLE001 - the GCS unreachable for a moment: the next second tries again
            pass
        _answered.wait(LIFE_S)
    try:
        _internal_kv_del(key)
    except Exception:  # noqa: BLE001 - Ray shutting down: the key goes with its session
        pass


class Traced:
    """Lets the driver collect what this actor recorded and check that its process answers."""

    @ray.method(concurrency_group="health")  # a role busy in a long call (an update) still hands its events over
    def drain_trace(self) -> dict:
        return tracer().drain()

    @ray.method(concurrency_group="health")
    def pid(self) -> int:
        _answered.set()  # the heartbeat is answered from now on: no more sign of life needed
        return os.getpid()
