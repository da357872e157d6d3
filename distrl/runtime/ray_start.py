"""Starting a Ray run's actors so that Ray can always restart them.

Ray re-creates a dead actor from its constructor arguments. An argument Ray keeps in the object store
(an ObjectRef, or anything over 100 KiB) may be gone by then, and the restart fails (Ray issue 53727;
Ray warns at the start of any actor given one, or given an actor handle). So every constructor
argument is small plain data: the config as a dict, indices, and the names of the peers an actor
calls (each run's actors are named `<run>-<role>`, and an actor looks its peers up by name).
"""
from __future__ import annotations

import pickle

import ray

from distrl.config import ConfigError, to_dict
from distrl.roles.factory import spec_of, trace_settings
from distrl.runtime.actors import Evaluator, GradientWorker, Learner, ParameterServer, ReplayServer, RolloutWorker
from distrl.runtime.external import ExternalServer
from distrl.runtime.inference import InferenceServer
from distrl.runtime.pacing import experience_spec
from distrl.runtime.ray_setup import (Roster, actor_options, heap_runtime_env, in_bundle, next_to, pack_group, roster,
                                     spread_group)
from distrl.runtime.heartbeat import Heartbeats
from distrl.runtime.watch import RoleWatch
from distrl.runtime.workers import WorkerPool

MAX_ARGUMENT_BYTES = 90_000  # under Ray's 100 KiB inline limit, with room for its own framing


def restartable(*args) -> tuple:
    """`args`, checked to travel inline with an actor's creation (so that a restart has them)."""
    size = len(pickle.dumps(args))
    if size > MAX_ARGUMENT_BYTES:
        raise ConfigError(f"the config takes {size} bytes; a role restarted by Ray gets it again only under "
                          f"{MAX_ARGUMENT_BYTES} (larger ones live in Ray's object store, where a restart can lose "
                          f"them): make env.kwargs smaller")
    return args


def start_roles(roles, cfg, start_time: float, address: str | None, eval_resume: dict | None, run: str) -> None:
    """Create the run's actors on `roles` (a RayRoles), its RoleWatch and WorkerPool."""
    d, f, heap_env, plan = to_dict(cfg), cfg.fault, heap_runtime_env(), roster(cfg, bool(address))
    wanted, device = plan.resources, plan.device
    place = {name: actor_options(res) for name, res in wanted.items()}
    role = {"max_restarts": f.max_role_restarts, "max_task_retries": 0}
    names = {"ps": f"{run}-parameter-server", "replay": f"{run}-replay",
             "inference": f"{run}-inference", "grads": [f"{run}-gradient-worker-{i}"
                                                         for i in range(plan.counts["gradient_workers"])]}
    # Gradient workers are spread over the nodes (one bundle each of a placement group, one per node where
    # enough nodes fit them): their point is more cores for the learner's arithmetic. A gradient call is pure,
    # so Ray may retry it on a restarted worker.
    grads = len(names["grads"])
    roles.group = spread_group(wanted["gradient_workers"], grads, f.start_timeout_s) if grads else None
    roles.ps = ParameterServer.options(name=names["ps"], **role, **place["parameter_server"]).remote(
        *restartable(trace_settings(cfg.log)))
    # On a cluster an unplaced replay server goes to the learner's node: batches that cross nodes leave
    # the learner waiting for them (bench/RESULTS.md, paper model).
    near = next_to(place["learner"], f.start_timeout_s) if address and not cfg.placement.replay else {}
    roles.replay = ReplayServer.options(name=names["replay"], **role, **place["replay"], **near,
                                        runtime_env=heap_env).remote(
        *restartable(experience_spec(cfg), trace_settings(cfg.log), d if cfg.data.dataset else None))
    roles.gradient_workers = [
        GradientWorker.options(name=names["grads"][i], **place["gradient_workers"], **in_bundle(roles.group, i),
                               max_restarts=f.max_role_restarts, max_task_retries=3).remote(*restartable(d, i))
        for i in range(grads)]
    roles.learner = Learner.options(**role, **place["learner"], **near, runtime_env=heap_env).remote(
        *restartable(d, names["ps"], names["replay"], device, names["grads"]))
    roles.evaluator = Evaluator.options(**role, **place["evaluator"]).remote(
        *restartable(d, names["ps"], start_time, eval_resume))
    # Its calls are retried on a restarted server, which pulls the weights again before it answers.
    roles.inference = [InferenceServer.options(name=names["inference"], **place["inference"],
                                               max_restarts=f.max_role_restarts, max_task_retries=-1).remote(
        *restartable(d, names["ps"], cfg.workers, device)) for _ in range(plan.counts["inference"])]
    watched = {"learner": roles.learner, "replay": roles.replay, "parameter_server": roles.ps,
               "evaluator": roles.evaluator, **{"inference": s for s in roles.inference},
               **{f"gradient_worker_{i}": g for i, g in enumerate(roles.gradient_workers)}}
    labels = {"replay": "replay server", "inference": "inference server"}
    for name, actor in watched.items():
        kind = "gradient_workers" if name.startswith("gradient_worker") else name
        roles.table.track(actor, kind, labels.get(name, name.replace("_", " ")))
    roles.beats = Heartbeats(roles.table, f.role_timeout_s)
    roles.watch = RoleWatch(watched, roles.beats, f.start_timeout_s)
    if address:  # the roles hold their CPUs before workers ask: a worker on the learner's node could take them
        roles._wait_for_roles()
    window_s = None if cfg.mode == "sync" else cfg.async_.window_s
    _start_workers(roles, plan, place, d, names, cfg.fault, cfg.placement.workers_strategy, window_s)
    # Embedded, no role reserves a CPU: workers start alongside the roles, waited for together. On a cluster
    # the roles answered already: the workers' first answers (each said on the console) are waited for.
    roles._wait_for_roles()
    if plan.counts["external"]:
        _publish_server(roles)


def _start_workers(roles, plan: Roster, place: dict, d: dict, names: dict, fault, strategy: str,
                   window_s: float | None) -> None:
    """The rollout workers (`d`: the config as they get it; `fault`: its section; `strategy`:
    placement.workers_strategy; `window_s`: async mode's gather window, None in sync mode).

    A dead worker is restarted by Ray with the same constructor args and options (so the same placement)
    and re-syncs its weights on its first sample; its in-flight fragment is lost and counted by the driver.
    Spreading uses Ray's SPREAD strategy rather than a placement group: it is one option per actor that Ray
    applies again on a restart, while a group reserves every bundle up front, has to be re-placed after a
    node loss, and must be removed at the end."""
    n, asks = plan.counts["workers"], plan.resources["workers"]
    # pack needs a group: Ray has no per-actor PACK
    roles.worker_group = pack_group(asks, n, fault.start_timeout_s) if strategy == "pack" and n else None
    spread = {"scheduling_strategy": "SPREAD"} if strategy == "spread" else {}
    where = [in_bundle(roles.worker_group, i) if roles.worker_group else spread for i in range(n)]
    inference = [names["inference"]] if roles.inference else []
    workers = [RolloutWorker.options(**place["workers"], **where[i], max_restarts=fault.max_worker_restarts + 1,
                                     max_task_retries=0).remote(*restartable(d, i, n, names["ps"], *inference))
               for i in range(n)]
    servers = [_start_server(roles, d, n, names["ps"], fault)] if plan.counts["external"] else []
    roles.pool = WorkerPool(workers + servers, fault, window_s, roles.beats, external=len(servers))


def _start_server(roles, d: dict, index: int, ps: str, fault):
    """The simulator server, worker `index` to the driver: on this node (simulators connect to the address
    written in the run dir), on a port fixed now so that a restart listens where its clients reconnect."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from distrl.roles.external_address import free_port, identity

    ext = roles.cfg.external
    token, port = identity(roles.run_dir, ext.host, ext.port)
    port = free_port(ext.host, port)
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    server = ExternalServer.options(num_cpus=0, scheduling_strategy=here, max_restarts=fault.max_role_restarts,
                                    max_task_retries=0).remote(*restartable(d, index, ps, token, port))
    roles.external_address = (ext.host, port, token)
    return server


def _publish_server(roles) -> None:
    """Once the simulator server listens (its constructor has returned), where simulators connect:
    RUN_DIR/external.json, and the console."""
    from distrl.roles.external_address import publish

    from ray.exceptions import GetTimeoutError, RayTaskError

    from distrl.core import RoleLost
    from distrl.runtime.ray_setup import ACTOR_GONE

    host, port, token = roles.external_address
    try:
        ray.get(roles.pool.workers[-1].pid.remote(), timeout=roles.cfg.fault.role_timeout_s)
    except (GetTimeoutError, RayTaskError, *ACTOR_GONE) as e:
        raise RoleLost(f"the simulator server did not start on {host}:{port}: {str(e).splitlines()[0][:200]}") from None
    publish(roles.run_dir, host, port, token, spec_of(roles.cfg.env, False, roles.cfg.external))
