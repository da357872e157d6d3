"""What a run says about its faults: one `distrl:` line per event on the console, and the same line, with
whatever Ray itself printed about it, in RUN_DIR/faults.log.

No Ray here: single mode's evaluator restarts are reported the same way.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

FAULTS_LOG = "faults.log"
SILENT_S = 1.5  # at a run's stop, a process whose heartbeat is this late is not waited for (it is ended)


class FaultLog:
    """Console lines and RUN_DIR/faults.log (appended: a resumed run continues it). `run_dir` None: the
    console only (roles started outside a run, as tests do)."""

    def __init__(self, run_dir: str | None, start_time: float, console: bool = True):
        self.path = os.path.join(run_dir, FAULTS_LOG) if run_dir else None
        self.start, self.console = start_time, console
        self.lock = threading.Lock()  # Ray's listener thread writes here too
        self.events: list[str] = []

    def event(self, text: str) -> None:
        """One event, e.g. `worker 1 died, restarted in 1.3 s`."""
        self.events.append(text)
        if self.console:
            print(f"distrl: {text}", file=sys.stderr, flush=True)
        self._append([f"[{time.time() - self.start:9.2f} s] distrl: {text}"])

    def ray_text(self, lines: list[str]) -> None:
        """What Ray printed about a fault (raylet's "A worker died ..."), kept off the console."""
        self._append([f"[{time.time() - self.start:9.2f} s] ray: {line}" for line in lines])

    def _append(self, lines: list[str]) -> None:
        if self.path is None:
            return
        with self.lock:
            try:
                with open(self.path, "a") as fh:
                    fh.write("".join(line.rstrip("\n") + "\n" for line in lines))
            except OSError:
                pass  # a full disk must not turn a survived fault into a failed run


def exit_cause(exitcode: int | None) -> str:
    """How a process ended, from its exit code: `SIGKILL`, `exit code 3`."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"
