"""Starting or joining Ray, and the allocator the heavy actors run on."""
from __future__ import annotations

import ctypes
import os
import socket
import time

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from distrl.config import ConfigError

ACTOR_GONE = (RayActorError, ActorUnavailableError)  # dead, or being restarted by Ray


def init_ray(address: str | None) -> None:
    """Join `address`, or start Ray embedded: loopback only, no dashboard."""
    if address:
        _check_reachable(address)
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if address:
        try:
            ray.init(address=address, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
            raise ConfigError(f"--address {address}: cannot join a Ray cluster there ({_first_line(e)})") from None
    else:
        # Embedded, we place every actor ourselves (they ask for no CPUs: see RayRoles), so one
        # Ray instance serves runs of any worker count.
        ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False,
                 _node_ip_address="127.0.0.1", log_to_driver=True, configure_logging=False)


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


def heap_runtime_env() -> dict:
    """Run an actor on jemalloc (bundled with Ray on Linux) instead of glibc malloc.

    The learner and replay server free many mid-sized arrays that Ray allocated
    on other threads; under glibc their resident memory creeps up even with
    malloc_trim (bench/RESULTS.md, soak). Skipped when the user sets LD_PRELOAD
    or DISTRL_JEMALLOC=0.
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
