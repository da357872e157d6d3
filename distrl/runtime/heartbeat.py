"""Every watched process's heartbeat, taken on a thread of the driver's own, and hung ones ended there.

Each role's actor answers `pid()` on a thread of its own (`actor_base`): a role busy in a long call (an
evaluation, a checkpoint, a slow env step) answers within milliseconds, and only a process that cannot run
at all (stopped, frozen, or on a node Ray has not yet declared lost) leaves it unanswered. `Heartbeats`
keeps one `pid()` call in flight per watched actor (roles and rollout workers alike), sent every second; one
left unanswered for `fault.role_timeout_s` while Ray's table says ALIVE is hung, and is ended at once
(`ActorTable.end`), whatever the driver's own thread is doing meanwhile (waiting on a role, a restart, a
checkpoint). Ray restarts it like any other death. No call's own length is ever taken for a hang.

A role answers no call before its constructor has returned, so while Ray's table says it is starting (or
coming back), its sign of life (`actor_base`: a count it puts in Ray's key-value store every second from
the first line of its constructor) stands in for the heartbeat: one that stops moving for
`fault.role_timeout_s` is hung in its start-up, and is ended the same way. A process not yet begun has no
sign of life: `fault.start_timeout_s` covers a start that is slow to come, or alive but slow.

The driver's thread reads what was heard (`answer`: who answered, from which process) when it looks
(`RoleWatch`, `WorkerPool`): putting a restarted role back in the run is done there.
"""
from __future__ import annotations

import threading
import time

import ray
from ray.exceptions import RayTaskError
from ray.experimental.internal_kv import _internal_kv_get

from distrl.runtime.actor_base import LIFE_KEY
from distrl.runtime.deaths import COMING_BACK, ActorTable
from distrl.runtime.faultlog import SILENT_S
from distrl.runtime.ray_setup import ACTOR_GONE

LOOK_S = 0.25  # how often the thread looks
RETRY_S = 0.2  # a heartbeat that failed (the process is down, or coming back) is sent again this soon
LIFE_READ_S = 0.5  # how often a starting process's sign of life is read


class Heartbeats:
    def __init__(self, table: ActorTable, timeout_s: float, interval_s: float = 1.0):
        self.table, self.timeout_s, self.interval_s = table, timeout_s, interval_s
        self.lock = threading.RLock()
        self.actors: dict[str, object] = {}  # name -> actor handle
        self.pending: dict[str, tuple] = {}  # name -> (its heartbeat in flight, when it was sent)
        self.answer: dict[str, tuple[float, int]] = {}  # name -> (when its newest answered heartbeat was sent, pid)
        self.failing: dict[str, float] = {}  # name -> since when its heartbeats fail (down, or coming back)
        self.next_ask: dict[str, float] = {}
        self.off: set[str] = set()  # no longer watched: lost, or ended for good
        self.life: dict[str, tuple[bytes, float]] = {}  # name -> (its sign of life in its start-up, when it last moved)
        self.next_life_read: dict[str, float] = {}
        self.ended_starts: set[str] = set()  # "PID NODE" of processes ended as hung in their start-up
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def watch(self, name: str, actor) -> None:
        with self.lock:
            self.actors[name], self.next_ask[name] = actor, 0.0

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="distrl-heartbeats", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop the thread (hung processes are no longer ended: the run is winding down)."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)

    def _run(self) -> None:
        while not self.stopped.wait(LOOK_S):
            try:
                self.look()
            except Exception:  # noqa: BLE001 - a GCS read failed, Ray shutting down: the next look tries again
                pass

    def look(self) -> None:
        """One round: read the answers that arrived, end the hung, send the heartbeats that are due."""
        with self.lock:
            self.table.poll()
            now = time.time()
            self._collect(now)
            for name, actor in self.actors.items():
                if name in self.off:
                    continue
                self._judge(name, now)
                self._judge_start(name, now)
                if name not in self.pending and now >= self.next_ask[name]:
                    self.pending[name] = (actor.pid.remote(), now)
                    self.next_ask[name] = now + self.interval_s

    def _collect(self, now: float) -> None:
        refs = {ref: name for name, (ref, _) in self.pending.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0) if refs else ([], [])
        for ref in ready:
            name = refs[ref]
            _, sent = self.pending.pop(name)
            try:
                self.answer[name] = (sent, ray.get(ref))
                self.failing.pop(name, None)
            except (*ACTOR_GONE, RayTaskError):
                self.failing.setdefault(name, now)
                self.next_ask[name] = now + RETRY_S

    def _judge(self, name: str, now: float) -> None:
        entry = self.pending.get(name)
        if entry is None:
            return
        state, since = self.state(name)
        if state == "ALIVE" and now - max(entry[1], since) > self.timeout_s:
            self.table.end(self.actors[name], f"hung (no answer within {self.timeout_s:g} s), ended")
            del self.pending[name]

    def _judge_start(self, name: str, now: float) -> None:
        """End a process whose sign of life in its start-up stopped moving for `timeout_s`."""
        if self.state(name)[0] not in COMING_BACK:
            self.life.pop(name, None)
            return
        if now < self.next_life_read.get(name, 0.0):  # the driver's thread looks too: one read per period
            return
        self.next_life_read[name] = now + LIFE_READ_S
        try:
            said = _internal_kv_get(LIFE_KEY.format(self.actors[name]._actor_id.hex()).encode())
        except Exception:  # noqa: BLE001 - the GCS unreachable for a moment: the next look reads it
            return
        if said is None:  # not begun yet (or begun and answering): nothing to judge
            self.life.pop(name, None)
            return
        if name not in self.life or self.life[name][0] != said:
            self.life[name] = (said, now)
            return
        pid, node, _ = said.decode().split()
        if now - self.life[name][1] > self.timeout_s and f"{pid} {node}" not in self.ended_starts:
            self.ended_starts.add(f"{pid} {node}")
            self.table.end(self.actors[name], f"hung in its start-up (no sign of life for {self.timeout_s:g} s), "
                                              f"ended", process=(int(pid), node))
            self.life.pop(name, None)

    def state(self, name: str) -> tuple[str, float]:
        """(its state, since when): Ray's table's; where that cannot be read, down while its heartbeats fail."""
        if self.table.readable:
            return self.table.state(self.actors[name])
        return ("RESTARTING", self.failing[name]) if name in self.failing else ("ALIVE", 0.0)

    def stop_watching(self, name: str) -> None:
        with self.lock:
            self.off.add(name)
            self.pending.pop(name, None)


def silent(actors: dict, known: dict, wait_s: float = SILENT_S) -> list[str]:
    """Of `actors` (name -> handle), those that do not answer a heartbeat sent now within `wait_s`, or answer
    from a process other than `known[name]` (a restart not yet put back in the run), or are gone."""
    refs = {name: actor.pid.remote() for name, actor in actors.items()}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=wait_s) if refs else ([], [])
    out = []
    for name, ref in refs.items():
        try:
            pid = ray.get(ref) if ref in ready else None
        except (*ACTOR_GONE, RayTaskError):
            pid = None
        if pid is None or known.get(name) not in (None, pid):
            out.append(name)
    return out
