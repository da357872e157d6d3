"""Single mode's evaluator: a process fed through pipes, watched like every other role.

It is forked from a fork server that has imported torch and distrl once (per driver process): a start
or restart then costs milliseconds, not the ~1.5 s of CPU a fresh interpreter spends importing them
(a spawn). The fork server is itself a fresh, single-threaded interpreter, so forking it is safe.

The driver never blocks on it: each pipe has a thread of its own on the driver's side (a send into a
stopped process, or a read of a result it was killed half-way through writing, blocks only that
thread, and ends with the process). The process beats a heartbeat from a thread of its own, so an
evaluation of any length never looks hung; one that is dead, or silent for `fault.role_timeout_s`
(stopped, deadlocked), is ended and started again with the run's evaluations and best so far, and
counted as an evaluator restart. The next evaluation it gets carries the newest weights. Once the run has
stopped (`wind_down`) no wait on it lasts past the wind-down's deadline, and a silent one is ended, not
restarted.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import time

from distrl.config import Config, from_dict, to_dict
from distrl.core import RoleLost
from distrl.observe.trace import configure, tracer
from distrl.roles.evaluation import LOWEST, make_evaluation, rank
from distrl.roles.factory import trace_settings
from distrl.runtime.faultlog import SILENT_S, FaultLog, exit_cause

PROCESS_NAME = "distrl-eval"  # its /proc comm: `pgrep -x distrl-eval` finds it
BEAT_S = 0.25
START_WAIT_S = 30.0  # how long ending a process still being started waits for its start


def _context():
    """Forks from a server that has the evaluator's imports done (spawn where there is no fork server)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    from distrl.registry import ALGORITHMS

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", __name__, *sorted({m.split(":")[0] for m in ALGORITHMS.values()})])
    return ctx


def _beat(heartbeat) -> None:
    while True:
        heartbeat.value = time.time()
        time.sleep(BEAT_S)


def evaluator_main(cfg_dict: dict, start_time: float, jobs, results, heartbeat, resume: dict | None) -> None:
    """Evaluator process: score each (weights, version, env_steps) it receives."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(PROCESS_NAME)
    except OSError:
        pass  # not Linux: only the name is lost
    threading.Thread(target=_beat, args=(heartbeat,), daemon=True).start()
    parent = os.getppid()
    cfg = from_dict(cfg_dict)
    configure("evaluator", None, *trace_settings(cfg.log))
    evaluation = make_evaluation(cfg, start_time, resume)
    answer = ("ready", None)
    while True:
        try:
            if answer is not None:
                results.send(answer)
        except OSError:  # the driver is gone (or ended this process's pipes): nobody to answer
            return
        answer = None
        if not jobs.poll(1.0):
            if os.getppid() != parent:  # the driver died (e.g. SIGKILL): don't linger as an orphan
                return
            continue
        try:
            job = jobs.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        answer = ("trace", tracer().drain()) if job == "trace" else ("result", evaluation.evaluate(*job))


class EvaluatorProcess:
    """One evaluator process and the driver's ends of its pipes."""

    def __init__(self, cfg_dict: dict, start_time: float, resume: dict):
        ctx = _context()
        self.heartbeat = ctx.RawValue("d", 0.0)
        jobs_in, self.jobs = ctx.Pipe(duplex=False)
        self.results, results_out = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=evaluator_main, name="Evaluator", daemon=True,
                                args=(cfg_dict, start_time, jobs_in, results_out, self.heartbeat, resume))
        self.started = time.time()
        # The first start waits until the fork server has imported torch and the algorithms (~1 s of
        # CPU): the driver goes on meanwhile, and jobs wait in the pipe.
        self.starting = threading.Thread(target=self._start, args=(jobs_in, results_out), daemon=True)
        self.starting.start()
        self.outbox: queue.Queue = queue.Queue()
        self.inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._send, daemon=True).start()
        threading.Thread(target=self._receive, daemon=True).start()

    def _start(self, jobs_in, results_out) -> None:
        try:
            self.proc.start()
        finally:  # the child holds the only other ends: its death is EOF / a broken pipe here
            jobs_in.close()
            results_out.close()

    def _send(self) -> None:
        while True:
            msg = self.inbox.get()
            try:
                self.jobs.send(msg)
            except (OSError, ValueError):  # it died (or we closed the pipe): nothing more goes through
                return
            if msg is None:
                return

    def _receive(self) -> None:
        while True:
            try:
                self.outbox.put(self.results.recv())
            except (EOFError, OSError, ValueError):
                return

    def send(self, msg) -> None:
        self.inbox.put(msg)

    def get(self, timeout: float):
        """The next message, or None after `timeout`."""
        try:
            return self.outbox.get(timeout=timeout) if timeout > 0 else self.outbox.get_nowait()
        except queue.Empty:
            return None

    def alive(self) -> bool:
        return self.starting.is_alive() or self.proc.is_alive()

    def silent_s(self) -> float:
        """Seconds since its last heartbeat (since its start while it has none)."""
        return time.time() - max(self.started, self.heartbeat.value)

    def beating(self) -> bool:
        return self.heartbeat.value > 0

    def end(self, grace_s: float = 0.0) -> None:
        """Stop it: asked to end within `grace_s`, else SIGKILL (a stopped process too)."""
        self.starting.join(timeout=START_WAIT_S)
        if grace_s > 0 and self.proc.is_alive():
            self.send(None)
            self.proc.join(timeout=grace_s)
        if self.proc.is_alive():  # (never started if the fork server did not answer in START_WAIT_S)
            kill_with_children(self.proc.pid)
            self.proc.join(timeout=5)
        self.inbox.put(None)  # the sender thread ends on a broken pipe or this
        for conn in (self.jobs, self.results):
            conn.close()


def descendants(root: int) -> list[int]:
    """Every process below `root` now (Linux's /proc/PID/task/TID/children; elsewhere none is found)."""
    below, todo = [], [root]
    while todo:
        kids = _children(todo.pop())
        below += kids
        todo += kids
    return below


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for thread in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{thread}/children") as fh:
                kids += [int(c) for c in fh.read().split()]
    except OSError:  # gone meanwhile, or no /proc
        pass
    return kids


def kill_with_children(pid: int) -> None:
    """SIGKILL `pid` and every process below it: an env's own processes (VizDoom's game) outlive a killed
    parent, and a run's end must not leave them behind."""
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:  # gone meanwhile
            pass


class LocalEvaluator:
    """Driver-side handle on the evaluator process: submit weights, poll results, restart it when it
    dies or hangs. No call waits longer than its timeout, nor on a dead process."""

    def __init__(self, cfg: Config, start_time: float, resume: dict | None, faults: FaultLog):
        self.cfg_dict, self.start_time, self.faults = to_dict(cfg), start_time, faults
        self.timeout_s, self.max_restarts = cfg.fault.role_timeout_s, cfg.fault.max_role_restarts
        self.start_s = cfg.fault.start_timeout_s
        self.stop_due = lambda: False  # the run's stop has come: a blocking wait for a result ends
        self.deadline: float | None = None  # once the run has stopped: no wait lasts past it
        self.progress = {"evaluations": 0, "best": LOWEST, **(resume or {})}
        self.restarts = 0
        self.down: tuple[str, float] | None = None  # (cause, since) while a restarted process is not ready
        self.traces: list[dict] = []
        self.results: list[dict] = []  # arrived, not yet polled
        self.proc = EvaluatorProcess(self.cfg_dict, start_time, dict(self.progress))
        self.ready = self.busy = self.gone = False  # gone: found dead at the run's end, not restarted
        # The heartbeat is judged on a thread of its own, whatever the driver's thread is doing (a long
        # learner call, a checkpoint); the lock keeps a process from being ended and replaced at once.
        self.lock, self.hung, self.closed = threading.RLock(), None, threading.Event()
        threading.Thread(target=self._watch, name="distrl-eval-heartbeat", daemon=True).start()

    def _watch(self) -> None:
        """End the process once its heartbeat has been silent for `fault.role_timeout_s` (not once the run has
        stopped: then it is ended at the stop if silent, and waited for no longer than the wind-down)."""
        while not self.closed.wait(0.25):
            with self.lock:
                p = self.proc
                if self.gone or self.deadline is not None or self.hung or not p.beating() or not p.alive():
                    continue
                if p.silent_s() > self.timeout_s:
                    self.hung = (f"hung (no sign of life for {self.timeout_s:g} s), ended", time.time())
                    kill_with_children(p.proc.pid)

    def check(self, restart: bool = True) -> None:
        """Read what arrived; a dead or silent process is ended and (with `restart`) started again."""
        if self.gone:
            return
        self._pump()
        restart = restart and self.deadline is None  # once the run has stopped, nothing restarts
        with self.lock:
            p, since = self.proc, time.time()
            if p.alive():
                if p.silent_s() <= (self.timeout_s if p.beating() else self.start_s):
                    return
                if not p.beating():  # never started: Ray roles that do not start or come back end the run too
                    raise RoleLost(f"the evaluator did not {'come back' if self.down else 'start'} within "
                                   f"{self.start_s:g} s")
                cause = f"hung (no sign of life for {self.timeout_s:g} s), ended"
            else:
                cause, since = self.hung or (f"died ({exit_cause(p.proc.exitcode)})", since)
            p.end()
            self.hung = None
            self._restarted(cause, restart, since)

    def _restarted(self, cause: str, restart: bool, since: float) -> None:
        self.restarts += 1  # counted when it is found dead, whatever happens next
        self.ready = self.busy = False
        if self.restarts > self.max_restarts:
            raise RoleLost(f"the evaluator {cause.split(' (')[0]} and its restarts are used up (fault.max_role_restarts)")
        if not restart:
            self.faults.event(f"evaluator {cause}")
            self.gone = True
            return
        self.down = (cause, since)
        self.proc = EvaluatorProcess(self.cfg_dict, self.start_time, dict(self.progress))

    def _pump(self, timeout: float = 0.0) -> None:
        """Handle the messages that arrived (waiting up to `timeout` for the first): results are kept for
        `poll`."""
        while True:
            msg = self.proc.get(timeout)
            if msg is None:
                return
            kind, body = msg
            if kind == "ready":
                self.ready = True
                if self.down is not None:
                    cause, since = self.down
                    self.faults.event(f"evaluator {cause}, restarted in {time.time() - since:.1f} s")
                    self.down = None
            elif kind == "trace":
                self.traces.append(body)
            else:
                self.busy = False
                self.progress["evaluations"] += 1
                self.progress["best"] = max(tuple(self.progress["best"]), rank(body))
                self.results.append(body)
            timeout = 0.0

    def _wait(self, seconds: float, done) -> None:
        """Until `done()` or `seconds` have passed (or the run's stop, or its wind-down's deadline), watching the
        process meanwhile."""
        deadline = min(time.time() + seconds, self.deadline or 1e18)
        self.check()
        while not done() and not self.gone and time.time() < deadline and (self.deadline is not None or not self.stop_due()):
            self._pump(min(0.2, max(0.0, deadline - time.time())))
            self.check()

    def idle(self, wait: bool = False) -> bool:
        """Ready for a job (`wait`: until it is, at most as long as it may take to start)."""
        self._wait(self.start_s if wait else 0.0, lambda: self.ready and not self.busy)
        return self.ready and not self.busy

    def submit(self, weights, version: int, env_steps: int) -> None:
        self.proc.send((weights, version, env_steps))
        self.busy = True

    def poll(self, block: bool = False, timeout: float | None = None) -> list[dict]:
        """Results that arrived (`block`: waiting up to `timeout` for the one in flight)."""
        if self.busy and not self.results:
            self._wait((1e9 if timeout is None else timeout) if block else 0.0, lambda: not self.busy)
        else:
            self.check()
        out, self.results = self.results, []
        return out

    def drain_trace(self) -> dict | None:
        """What the evaluator process recorded (after the evaluation in flight, if any)."""
        self._wait(self.timeout_s, lambda: not self.busy)
        if self.busy or not self.ready:
            return None
        self.proc.send("trace")
        self._wait(self.timeout_s, lambda: bool(self.traces))
        return self.traces.pop() if self.traces else None

    def wind_down(self, deadline: float) -> list[str]:
        """The run has stopped: no wait lasts past `deadline` from now on; a process silent now (hung), or
        still starting after a restart, is ended and not restarted: ["evaluator"], else []. One in its first
        start is waited for, within the deadline (a short run's last evaluation): the fork server it comes
        from may itself be starting, before the process can beat."""
        self.deadline = deadline
        self.check(restart=False)  # a death or hang found by now is counted (and not restarted)
        with self.lock:
            p = self.proc
            starting = not self.ready and self.down is None
            if self.gone or (p.alive() and (starting or (self.ready and p.silent_s() <= SILENT_S))):
                return []
            p.end()
            self.gone = True
        return ["evaluator"]

    def close(self) -> None:
        """Asked to end when it is idle and beating, else ended at once."""
        self.closed.set()
        with self.lock:
            idle = not self.gone and self.ready and not self.busy and self.proc.silent_s() <= SILENT_S
            self.proc.end(grace_s=2.0 if idle else 0.0)
