"""Finding the Ray actor processes of this test session only (other Ray instances on the machine,
a benchmark's say, must never be signalled)."""
import os
import subprocess


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def descends_from_us(pid: int) -> bool:
    root = os.getpid()
    while pid > 1:
        if pid == root:
            return True
        pid = _parent(pid)
    return False


def pids_of(name: str) -> list[int]:
    """Processes of the actor class `name` (e.g. "RolloutWorker") started by this session's Ray."""
    out = subprocess.run(["pgrep", "-f", f"ray::{name}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if descends_from_us(int(p))]


def kill_one_once_logging(run_dir: str, name: str, timeout_s: float = 100.0):
    """A started thread that SIGKILLs one `name` actor process once the run has written a few metrics rows;
    the list it returns gets (pid, time) of the kill."""
    import signal
    import threading
    import time

    killed: list = []

    def kill():
        metrics, deadline = os.path.join(run_dir, "metrics.csv"), time.time() + timeout_s
        while time.time() < deadline and not (os.path.exists(metrics) and len(open(metrics).readlines()) > 2):
            time.sleep(0.1)
        pids = pids_of(name)
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.append((pids[0], time.time()))

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread, killed


def stop_as_ctrl_c() -> None:
    """Stop the run this process is driving as a first Ctrl-C would (a clean stop), by calling its own SIGINT
    handler from this (non-main) thread: a signal sent to the process once the run has ended and pytest's
    handler is back would interrupt pytest itself. Once the run has ended the handler is no longer there."""
    import signal

    handler = signal.getsignal(signal.SIGINT)
    if getattr(handler, "__module__", None) == "distrl.runtime.launch":
        handler(signal.SIGINT, None)
