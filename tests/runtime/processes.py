"""Finding the Ray actor processes of this test session only (other Ray instances on the machine,
a benchmark's say, must never be signalled)."""
import os
import subprocess
import threading
import time

from bench.procfs import parent, started_at

# For fault tests that need a run going, not learning: CartPole whose step waits 3 ms on the clock, so the
# run is paced and leaves the cores to the suite's other pytest process (few eval episodes: each waits too).
PACED = ["env.id=distrl.envs.testing:WaitingCartPole-v1", "env.kwargs={step_s: 0.003}", "eval.episodes=2"]


def descends_from_us(pid: int) -> bool:
    root = os.getpid()
    while pid > 1:
        if pid == root:
            return True
        pid = parent(pid)
    return False


def pids_of(name: str) -> list[int]:
    """Processes of the actor class `name` (e.g. "RolloutWorker") started by this session's Ray, or
    single mode's evaluator processes ("distrl-eval") started by this session's runs."""
    args = ["pgrep", "-x", name] if name == "distrl-eval" else ["pgrep", "-f", f"ray::{name}"]
    out = subprocess.run(args, capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if descends_from_us(int(p))]


def snapshot(name: str) -> set:
    """The `name` processes there now, as (pid, start time): an earlier test's may still be exiting."""
    return {(pid, started_at(pid)) for pid in pids_of(name)}


def new_pids(name: str, before: set) -> list[int]:
    """`name` processes not in `before` (a `snapshot`): this run's."""
    return [pid for pid in pids_of(name) if (pid, started_at(pid)) not in before]


def resume_if_stopped(pid: int, start: int | None) -> None:
    """SIGCONT a process this test stopped, if it is still that process (the run should have ended it)."""
    import signal

    if start is not None and started_at(pid) == start and descends_from_us(pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def kill_one_once_logging(run_dir: str, name: str, timeout_s: float = 100.0):
    """A started thread that SIGKILLs one `name` actor process of the run about to start, once the run
    has written a few metrics rows; the list it returns gets (pid, time) of the kill.

    Only a process that was not a `name` actor when this was called is a candidate: a previous test's
    actor may still be exiting (Ray reaps killed actors asynchronously), and killing it would leave this
    run untouched. Processes are told apart by (pid, start time), so a reused pid is not mistaken for an
    old one. An idle Ray worker that becomes one of this run's actors counts as new: its title changes."""
    import signal
    import threading
    import time

    before = {(pid, started_at(pid)) for pid in pids_of(name)}
    killed: list = []

    def kill():
        metrics, deadline = os.path.join(run_dir, "metrics.csv"), time.time() + timeout_s
        while time.time() < deadline:
            if os.path.exists(metrics) and len(open(metrics).readlines()) > 2:
                ours = [pid for pid in pids_of(name) if (pid, started_at(pid)) not in before]
                if ours:
                    os.kill(ours[0], signal.SIGKILL)
                    killed.append((ours[0], time.time()))
                    return
            time.sleep(0.1)

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


def fault_events(run_dir: str) -> list[tuple[float, str]]:
    """RUN_DIR/faults.log's distrl lines: (seconds into the run, the event)."""
    path, out = os.path.join(run_dir, "faults.log"), []
    for line in open(path).read().splitlines() if os.path.exists(path) else []:
        stamp, _, text = line.partition(" s] ")
        if text.startswith("distrl: "):
            out.append((float(stamp.strip("[ ")), text.removeprefix("distrl: ")))
    return out


def ended_at(event: tuple[float, str]) -> float:
    """When the process an event line reports was found dead or ended (seconds into the run)."""
    at, text = event
    return at - float(text.rsplit("restarted in ", 1)[1].split(" s")[0])


def stop_once_back(run_dir: str, done: threading.Event, rows_after: int = 4) -> None:
    """Stop the run as a Ctrl-C would once faults.log has a restart and `rows_after` more metrics rows."""
    deadline = time.time() + 180
    while time.time() < deadline and not done.is_set() and not any(
            ", restarted " in text for _, text in fault_events(run_dir)):
        time.sleep(0.1)
    rows = len(open(os.path.join(run_dir, "metrics.csv")).readlines()) if not done.is_set() else 0
    while time.time() < deadline and not done.is_set():
        if len(open(os.path.join(run_dir, "metrics.csv")).readlines()) >= rows + rows_after:
            stop_as_ctrl_c()
            return
        time.sleep(0.1)


def kill_session(sid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL every live process of session `sid` (a driver started with `start_new_session` and all it
    started), as a lost machine would end them. Ray puts each worker in a process group of its own, so a
    killpg of the driver's group leaves them to notice their raylet's death, seconds later, and meanwhile
    they go on writing; they stay in the driver's session."""
    import signal
    import time

    from bench.procfs import stat_fields

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        members = []
        for name in os.listdir("/proc"):
            try:
                if name.isdigit() and os.getsid(int(name)) == sid and stat_fields(int(name))[:1] != ["Z"]:
                    members.append(int(name))
            except (ProcessLookupError, PermissionError):
                pass
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"processes of session {sid} still alive after {timeout_s:g} s")
