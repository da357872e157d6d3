"""Starting or joining Ray, what each role asks the cluster for (and whether it can get it), and the
allocator the heavy actors run on."""
from __future__ import annotations

import ctypes
import logging
import os
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import ray
from ray.exceptions import ActorUnavailableError, AuthenticationError, GetTimeoutError, RayActorError, RayTaskError

from distrl.config import ConfigError
from distrl.core import RoleLost
from distrl.runtime.deaths import route_ray_text

ACTOR_GONE = (RayActorError, ActorUnavailableError)  # dead, or being restarted by Ray
# For a Ray distrl starts (and a test cluster's head, which passes it to every node that joins): the roles run
# at the driver's priority. Ray's default (nice 15) gives any other busy process on the machine ~28x a role's
# CPU share, so a learner or a restarting role starves next to a simulator or a second run.
SYSTEM_CONFIG = {"worker_niceness": 0}


def leave_ray() -> None:
    """Stop the embedded Ray (or leave the cluster), if this process joined one."""
    if ray.is_initialized():
        ray.shutdown()


def init_ray(address: str | None, user_modules: list | None = None) -> None:
    """Join `address`, or start Ray embedded: no dashboard, Ray's own token authentication (its default:
    a token in ~/.ray/auth_token, made on first use). On a cluster, `user_modules` (the user's own code a
    run imports, e.g. a `model.torso` factory) are shipped to every node with the job's runtime_env, so
    they need not be installed there; embedded, workers import them as the driver does (Ray puts the
    driver's directory on their path). A join the cluster refuses for its token is one line saying what
    to set."""
    if address:
        _check_reachable(address)
    route_ray_text()  # even into a Ray started by the caller: its error listener looks the printer up per message
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if address:
        shipped = {"runtime_env": {"py_modules": list(user_modules)}} if user_modules else {}
        try:
            # Ray's own INFO lines ("Connecting to existing Ray cluster ...") stay off, as embedded:
            # a refused config is one line on stderr. Its warnings still show.
            with _stderr_held():  # Ray's C++ client logs a line per refused retry: the refusal is one line
                ray.init(address=address, log_to_driver=True, configure_logging=False, **shipped)
        except AuthenticationError as e:  # RAY_AUTH_MODE=token, and no token where Ray looks for one
            found = _first_line(e).split(". ")[0]  # e.g. "... no authentication token was found"
            raise ConfigError(f"--address {address}: RAY_AUTH_MODE=token, but: {found}; {TOKEN_HINT}") from None
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
            if "InvalidAuthToken" in f"{e} {e.__cause__}":
                sent = "the token this driver sent is not the cluster's" if _token_mode() else \
                    "this driver sent no token (RAY_AUTH_MODE is not token)"
                raise ConfigError(f"--address {address}: the cluster requires token authentication and refused "
                                  f"the connection: {sent}; {TOKEN_HINT}") from None
            raise ConfigError(f"--address {address}: cannot join a Ray cluster there ({_first_line(e)})") from None
    else:
        # Embedded, we place every actor ourselves (they ask for no CPUs: see RayRoles), so one
        # Ray instance serves runs of any worker count.
        with _quiet("ray._private.authentication.authentication_token_setup"):  # "Token authentication is enabled"
            ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False,
                     _node_ip_address="127.0.0.1", log_to_driver=True, configure_logging=False,
                     _system_config=SYSTEM_CONFIG)


TOKEN_HINT = ("set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, a file) to the cluster's token "
              "(`ray get-auth-token` on the head prints it) before starting distrl")


def _token_mode() -> bool:
    """Whether this process sends a token (Ray reads RAY_AUTH_MODE when it is imported)."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode

        return get_authentication_mode() == AuthenticationMode.TOKEN
    except ImportError:
        return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"


@contextmanager
def _stderr_held():
    """Hold what is written to file descriptor 2 during the block (C++ logging included), and pass it on
    only if the block succeeds."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        sys.stderr.write(held.read().decode("utf-8", "replace"))


@contextmanager
def _quiet(logger_name: str):
    """A logger's warnings off for the block (Ray's notices at a clean start)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def user_modules(model_cfg) -> list:
    """The user's own code this run's roles import (a `model.torso` factory outside installed packages)."""
    from distrl.models.factory import user_code

    module = user_code(model_cfg.torso)
    return [module] if module is not None else []


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A host:port address must answer a TCP connect: Ray itself retries an unreachable one for minutes."""
    if address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address}: expected auto, ray://host:port or host:port")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"--address {address}: no Ray cluster answers there ({e.strerror or e})") from None


ROLES = ("learner", "replay", "parameter_server", "evaluator", "workers", "gradient_workers", "inference")


def role_resources(placement, central_inference: bool, clustered: bool, device: str) -> dict[str, dict[str, float]]:
    """What one actor of each role asks Ray for: its `placement` (the config section) plus what the role
    always reserves.

    On a cluster each worker and the learner reserve a CPU, so Ray spreads them over nodes; embedded on
    one machine, reservations would only cap the worker count (the other roles mostly wait: no CPU). On
    `device` cuda the learner, and a central inference server, reserve a GPU.
    """
    cpus = 1.0 if clustered else 0.0
    gpu = device.startswith("cuda")
    # With central inference the server shares the learner's GPU: half each, so one GPU holds both.
    gpu_share = (0.5 if central_inference else 1.0) if gpu else 0.0
    always = {"workers": {"CPU": cpus}, "gradient_workers": {"CPU": cpus},
              "inference": {"CPU": cpus, "GPU": gpu_share}, "learner": {"CPU": cpus, "GPU": gpu_share}}
    return {role: {**always.get(role, {"CPU": 0.0}), **{str(k): float(v) for k, v in getattr(placement, role).items()}}
            for role in ROLES}


@dataclass(frozen=True)
class Roster:
    """The actors a run starts: how many of each role, what one of each asks Ray for, and the device the
    learner (and a central inference server) run on."""

    counts: dict[str, int]
    resources: dict[str, dict[str, float]]
    device: str


def roster(cfg, clustered: bool) -> Roster:
    """The run's roster: the one place that reads its learner, rollout, data, workers, placement and device
    together (`clustered`: on a cluster, where workers and the learner reserve a CPU each)."""
    from distrl.roles.factory import resolve_device

    counts = dict.fromkeys(ROLES, 1)
    counts["gradient_workers"] = cfg.learner.num_gradient_workers if cfg.learner.num_gradient_workers > 1 else 0
    counts["inference"] = int(cfg.rollout.inference == "central")
    # An offline run's replay holds its dataset; external simulators stand in for workers unless asked beside them.
    own = not cfg.data.dataset and (cfg.external.with_workers or not cfg.external.enabled)
    counts["workers"] = cfg.workers if own else 0
    counts["external"] = int(cfg.external.enabled)
    device = resolve_device(cfg.device)
    return Roster(counts, role_resources(cfg.placement, bool(counts["inference"]), clustered, device), device)


def actor_options(resources: dict[str, float]) -> dict:
    """`.options()` for an actor asking for `resources` (Ray takes CPU and GPU only as num_cpus / num_gpus)."""
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": resources.get("CPU", 0.0), "num_gpus": resources.get("GPU", 0.0), "resources": custom}


def spread_group(resources: dict[str, float], count: int, timeout_s: float, strict_grace_s: float = 15.0):
    """A placement group reserving `count` bundles of `resources`, one per node where enough nodes could
    hold one. None when one actor asks for nothing: there is nothing to reserve.

    Ray's SPREAD looks only at what is free at that moment, so actors of a run that just ended (still
    releasing their CPUs) made it pack two bundles onto one node. STRICT_SPREAD waits for them; it falls
    back to SPREAD after `strict_grace_s` (another run holds the nodes) or when too few nodes fit one
    bundle. Ray re-places a bundle whose node dies and restarts its actor there."""
    bundle = {k: v for k, v in resources.items() if v > 0}
    fitting = sum(1 for n in ray.nodes() if n["Alive"] and fits(n["Resources"], bundle))
    if bundle and count > 1 and fitting >= count:
        group = reserve(bundle, count, "STRICT_SPREAD", min(strict_grace_s, timeout_s))
        if group is not None:
            return group
    return reserve(bundle, count, "SPREAD", timeout_s, "the gradient workers'")


def pack_group(resources: dict[str, float], count: int, timeout_s: float):
    """A PACK placement group for the rollout workers: `count` bundles of `resources` on as few nodes as
    hold them (Ray has no per-actor PACK strategy). None when a worker asks for nothing (embedded: one
    node, nothing to reserve). A worker restarted by Ray goes back into its bundle."""
    return reserve(resources, count, "PACK", timeout_s, "the workers'")


def reserve(resources: dict[str, float], count: int, strategy: str, timeout_s: float, whose: str | None = None):
    """A placement group of `count` bundles of `resources` (its positive amounts) once Ray has reserved
    it; None when one asks for nothing. Not reserved within `timeout_s`: nothing is left reserved, and
    it is None, or RoleLost naming `whose` bundles when given."""
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = {k: v for k, v in resources.items() if v > 0}
    if not bundle or count < 1:
        return None
    group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    if group.wait(timeout_seconds=timeout_s):
        return group
    remove_placement_group(group)
    if whose is None:
        return None
    raise RoleLost(f"{whose} {count} bundles of {bundle} could not be reserved within {timeout_s:g} s "
                   f"(other jobs hold the resources)")


def fits(node: dict[str, float], asks: dict[str, float]) -> bool:
    """Whether a node offering `node` (Ray's per-node resources) can hold one actor asking for `asks`."""
    return all(node.get(k, 0.0) >= v for k, v in asks.items() if v > 0)


@ray.remote(num_cpus=0)
def _node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def next_to(options: dict, timeout_s: float) -> dict:
    """`.options()` pinning actors to a node where an actor asking for `options` can run, found by running
    a probe task with those options there. Pinned hard: Ray's soft affinity placed one actor in three
    elsewhere on a two-node cluster. A pinned actor restarts on that node only."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = _node_id.options(**options).remote()
    try:
        node = ray.get(probe, timeout=timeout_s)
    except GetTimeoutError:
        ray.cancel(probe, force=True)
        raise RoleLost(f"no node had room for the learner ({_asks(options)}) within {timeout_s:g} s "
                       f"(other jobs hold the resources)") from None
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def _asks(options: dict) -> str:
    asked = {"CPU": options.get("num_cpus", 0), "GPU": options.get("num_gpus", 0), **options.get("resources", {})}
    return _listed({k: v for k, v in asked.items() if v})


def in_bundle(group, index: int) -> dict:
    """`.options()` putting an actor into bundle `index` of `group`; Ray's SPREAD strategy without one."""
    if group is None:
        return {"scheduling_strategy": "SPREAD"}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)}


def check_placement(plan: Roster, address: str | None, modules: list | None = None) -> None:
    """ConfigError naming the role and the resources when the cluster cannot host a role's actors (no
    node offers enough of a resource, no one node offers all that one actor asks for together, or all
    the roles together need more than the cluster has): Ray itself would leave such an actor pending
    for ever. Joins (or starts) the Ray the run will use (shipping the user's `modules` to a cluster)."""
    wanted = plan.resources
    if not address and not any(v > 0 for res in wanted.values() for v in res.values()):
        return  # embedded and asking for nothing: no need to start Ray to know it fits
    init_ray(address, modules)
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    where = f"the cluster at {address}" if address else "the embedded Ray (no --address)"
    needed: dict[str, float] = {}
    for role in ROLES:
        count, asks = plan.counts[role], {k: v for k, v in wanted[role].items() if v > 0}
        if not count:
            continue  # the role starts no actor in this run: its placement is not used
        for name, amount in asks.items():
            most = max((node.get(name, 0.0) for node in nodes), default=0.0)
            if most < amount:
                offered = f"at most {most:g} on one node" if most else "no node offering it"
                raise ConfigError(f"config key 'placement.{role}': {role} asks for {_shown(name)}: {amount:g} per actor; "
                                  f"{where} has {offered}")
        if not any(fits(node, asks) for node in nodes):
            raise ConfigError(f"config key 'placement.{role}': {role} asks for {_listed(asks)} per actor; no "
                              f"single node of {where} has all of that")
        for name, amount in asks.items():
            needed[name] = needed.get(name, 0.0) + amount * count
            total = sum(node.get(name, 0.0) for node in nodes)
            if needed[name] > total + 1e-9:
                raise ConfigError(f"config key 'placement.{role}': the roles up to {role} need {_shown(name)}: "
                                  f"{needed[name]:g} in all; {where} has {total:g}")


def _shown(name: str) -> str:
    """A resource name as the user wrote it, quoted when it holds a newline or other unprintable text."""
    return name if name.isprintable() else repr(name)


def _listed(asks: dict[str, float]) -> str:
    return ", ".join(f"{_shown(k)}: {v:g}" for k, v in asks.items())


def heap_runtime_env() -> dict:
    """Run an actor on jemalloc (bundled with Ray on Linux) instead of glibc malloc.

    The learner and replay server free many mid-sized arrays that Ray allocated
    on other threads; under glibc their resident memory grows with the number of
    updates (bench/RESULTS.md, soak). Skipped when the user sets LD_PRELOAD or
    DISTRL_JEMALLOC=0.
    """
    lib = os.path.join(os.path.dirname(ray.__file__), "core", "libjemalloc.so")
    if os.environ.get("LD_PRELOAD") or os.environ.get("DISTRL_JEMALLOC") == "0" or not os.path.exists(lib):
        return {}
    return {"env_vars": {"LD_PRELOAD": lib}}


class HeapTrimmer:
    """Hands freed heap pages back to the OS at most every `interval_s` (glibc only).

    After a large free glibc raises its mmap threshold, so per-block arrays then
    live on the heap and the pages they free stay resident; malloc_trim releases
    them in about a millisecond. The fallback for when jemalloc is not preloaded.
    """

    def __init__(self, interval_s: float = 5.0):
        try:
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
            self._trim = None
        if "jemalloc" in os.environ.get("LD_PRELOAD", ""):  # glibc's heap is not in use
            self._trim = None
        self.interval_s, self.last = interval_s, time.monotonic()

    def maybe_trim(self) -> None:
        if self._trim is not None and time.monotonic() - self.last >= self.interval_s:
            self._trim(0)
            self.last = time.monotonic()


def settle(refs: list, timeout_s: float) -> None:
    """Wait at most `timeout_s` for `refs`, reading the outcome of those done (a gone actor's error ignored,
    so Ray prints no unhandled one)."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    for ref in ready:
        try:
            ray.get(ref)
        except (*ACTOR_GONE, RayTaskError):
            pass
