"""Which role processes died, and when they came back, from Ray's own record of them: the GCS actor
table. `NumRestarts` goes up the moment Ray sees a process die (tens of milliseconds after a SIGKILL),
so a restart is counted then, whatever the run does next, and a count never depends on the role or the
driver calling it again. `State` says whether it is back (ALIVE), coming back (RESTARTING), or gone
for good (DEAD: its restarts used up).

The table is read through `ray._private.state` (a private API, checked by tests against the pinned
Ray). Where it cannot be read (a Ray Client connection), the driver still runs; restarts are then
counted when a role answers from a new process.

Also here: ending a hung process so that Ray restarts it, and keeping raylet's own lines (its "A worker
died or was killed ...", its disk monitor's warnings) off the console, in RUN_DIR/faults.log.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import ray

from distrl.runtime.faultlog import FaultLog

COMING_BACK = ("RESTARTING", "PENDING_CREATION", "DEPENDENCIES_UNREADY")
HELD_LINES = 200  # raylet lines kept while no run is open


@dataclass
class Tracked:
    actor: object
    role: str   # the Restarts field it counts in: workers, learner, ...
    label: str  # what the console calls it: "worker 1", "replay server"
    restarts: int = 0  # NumRestarts last read
    state: str = "PENDING_CREATION"
    since: float = field(default_factory=time.time)  # when `state` was first read
    pid: int = 0
    node: str = ""
    down: tuple[str, float] | None = None  # (cause, since) from a death until it is ALIVE again
    ended: tuple[str, float] | None = None  # (why, when) the driver ended its process, until Ray reports it


def read_actor(actor_id: str) -> dict | None:
    """The GCS actor table's row of one actor; None where it cannot be read."""
    try:
        from ray._private import state

        return state.actors(actor_id=actor_id) or None
    except Exception:  # noqa: BLE001 - a Ray Client session, or a GCS being restarted: no row this time
        return None


class ActorTable:
    """Restart counts, states and console events for the actors a run tracks."""

    def __init__(self, faults: FaultLog, interval_s: float = 0.5):
        self.faults, self.interval_s = faults, interval_s
        self.tracked: dict[str, Tracked] = {}  # actor id -> what is known of it
        self.last_read = 0.0
        self.readable = True  # False once a read failed for every actor: counts fall back to pids
        self.lock = threading.RLock()  # the heartbeats' thread reads and ends too
        self.here = ray.get_runtime_context().get_node_id()

    def track(self, actor, role: str, label: str) -> None:
        self.tracked[actor._actor_id.hex()] = Tracked(actor, role, label)

    def of(self, actor) -> Tracked:
        return self.tracked[actor._actor_id.hex()]

    def poll(self, force: bool = False) -> None:
        """Read the table (at most every `interval_s` unless `force`) and report what changed."""
        with self.lock:
            now = time.time()
            if not force and now - self.last_read < self.interval_s:
                return
            self.last_read, rows = now, 0
            for actor_id, t in list(self.tracked.items()):
                row = read_actor(actor_id)
                if row is not None:
                    rows += 1
                    self._update(t, row, now)
            self.readable = rows > 0 or not self.tracked

    def _update(self, t: Tracked, row: dict, now: float) -> None:
        restarts, state = int(row["NumRestarts"]), row["State"]
        changed = state != t.state
        if restarts > t.restarts:  # died (once or more) since the last read: a new process, or one coming
            cause, at = t.ended or ("died", now)
            cause += f" {restarts - t.restarts} times" if restarts - t.restarts > 1 else ""
            t.down = (cause, at) if t.down is None else (f"{t.down[0]}, then {cause} again", t.down[1])
            t.ended, t.restarts, changed = None, restarts, True
        if changed:
            t.state, t.since = state, now
        if state == "ALIVE" and t.down is not None:  # back (however fast: it may never have read RESTARTING)
            cause, since = t.down
            back = float(row.get("Timestamp") or 0) / 1000.0 or now  # when Ray recorded it alive
            took = f"in {back - since:.1f} s" if back > since else f"within {self.interval_s:g} s"  # faster than a read
            self.faults.event(f"{t.label} {cause}, restarted {took}")
            t.down = None
        elif state == "DEAD" and changed and (t.ended or ("",))[0] != "closed":
            self.faults.event(f"{t.label} died and its restarts are used up")
        if state == "ALIVE":
            t.pid, t.node = int(row.get("Pid") or 0), (row.get("Address") or {}).get("NodeID", "")

    def restarts(self, role: str) -> int:
        """Deaths Ray restarted (or is restarting) `role`'s actors after."""
        return sum(t.restarts for t in self.tracked.values() if t.role == role)

    def state(self, actor) -> tuple[str, float]:
        """(its state, since when) as last read."""
        t = self.of(actor)
        return t.state, t.since

    def end(self, actor, cause: str, process: tuple[int, str] | None = None) -> None:
        """End a hung actor's process so that Ray restarts it: SIGKILL when it runs on this node (at
        once, a stopped process too), else through Ray. The death is counted when Ray reports it.
        `process`: (pid, node id) of one that is still starting (the table has a pid only once ALIVE)."""
        t = self.of(actor)
        pid, node = process or (t.pid, t.node)
        with self.lock:
            t.ended = (cause, time.time())
            if pid and node == self.here:
                try:
                    os.kill(pid, signal.SIGKILL)
                    return
                except OSError:
                    pass  # gone already: Ray is about to report it
            ray.kill(actor, no_restart=False)

    def end_for_good(self, actor) -> None:
        """End an actor's process with no restart (a run's stop: nothing is waited for), at once: a stopped
        process too. Not a death to count or report."""
        t = self.of(actor)
        with self.lock:
            t.ended = ("closed", time.time())
            ray.kill(actor, no_restart=True)  # its calls fail from now on
            if t.state == "ALIVE" and t.pid and t.node == self.here:  # Ray ends one that does not answer seconds later
                try:
                    os.kill(t.pid, signal.SIGKILL)
                except OSError:
                    pass

    def settle(self, timeout_s: float) -> None:
        """For an exact count at a run's end: an actor whose process is gone but still ALIVE in the table
        (Ray has yet to notice: tens of milliseconds after a SIGKILL) fails a call; wait for the table."""
        alive = [t for t in self.tracked.values() if t.state == "ALIVE"]
        refs = {t.actor._actor_id.hex(): t.actor.pid.remote() for t in alive}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        failed = {}  # actor id -> its restarts before
        for actor_id, ref in refs.items():
            try:
                if ref in ready:
                    ray.get(ref)
            except Exception:  # noqa: BLE001 - dead or restarting: what the table is waited for
                failed[actor_id] = self.tracked[actor_id].restarts
        deadline = time.time() + timeout_s
        self.poll(force=True)
        while any(self.tracked[i].state == "ALIVE" and self.tracked[i].restarts == n for i, n in failed.items()) \
                and time.time() < deadline:
            time.sleep(0.05)
            self.poll(force=True)

    def close(self) -> None:
        for t in self.tracked.values():
            t.ended = ("closed", time.time())


class _RayText:
    """Where raylet's own lines go: the open run's faults.log, or held (the newest few) until one opens."""
    faults: FaultLog | None = None
    held: deque = deque(maxlen=HELD_LINES)


def route_ray_text() -> None:
    """Keep raylet's own lines ("A worker died or was killed ...", "/tmp/ray ... is over 95% full") off the
    console from the moment Ray starts: they go to the open run's faults.log (see
    `keep_ray_text_off_the_console`). Call before `ray.init`: its log printer binds the module's
    `print_to_stdstream` when Ray connects, and the error listener looks it up at every message, so
    replacing that one global covers both. The workers' own output keeps Ray's printer."""
    import ray._private.worker as ray_worker

    if hasattr(ray_worker.print_to_stdstream, "distrl_original"):
        return
    original = ray_worker.print_to_stdstream

    def printer(data, ignore_prefix=False, *args, **kwargs):
        if data.get("pid") != "raylet":
            return original(data, ignore_prefix, *args, **kwargs)
        lines = [str(line) for line in data.get("lines", [])]
        faults = _RayText.faults
        if faults is None:
            _RayText.held.extend(lines)
        else:
            faults.ray_text(lines)
        return None

    printer.distrl_original = original
    ray_worker.print_to_stdstream = printer


def keep_ray_text_off_the_console(faults: FaultLog | None) -> None:
    """Send raylet's lines to `faults` (RUN_DIR/faults.log), with those Ray printed since it started; None
    (the run closed): hold them for the next run and drop what was held."""
    _RayText.faults = faults
    if faults is not None and _RayText.held:
        faults.ray_text(list(_RayText.held))
    _RayText.held.clear()
