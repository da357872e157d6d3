"""One compute thread per process: every role is its own process already, and on a
few cores intra-op threads only contend with the other roles.

numpy's OpenBLAS would otherwise start a thread per core that spins between calls
and takes the core another role (in single mode, the evaluator) needs.
"""
from __future__ import annotations

import importlib
import os
import sys


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container or `taskset` may allow fewer than
    the machine has)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def one_compute_thread(load_torch: bool = False) -> None:
    """Limit numpy's BLAS, and torch (if loaded, or `load_torch`), to one thread in this process."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")
    if load_torch:
        importlib.import_module("torch")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def torch_threads(n: int) -> None:
    """torch's intra-op threads in this process (torch already loaded)."""
    sys.modules["torch"].set_num_threads(n)


MIN_TRIAL_UPDATES = 2  # per side of a trial cut short by its time: one update's time is too noisy
# An update this quick on one thread (a small MLP's) is too fine-grained for more threads to pay: their
# hand-offs per op cost more than they share. No trial then: its updates on more threads would also split
# sums differently, and a seed would take another trajectory than on one thread.
SMALL_UPDATE_S = 0.005


class ThreadChoice:
    """How many torch threads a CPU learner trains with: `most` (the cores nothing else uses while it
    trains), or 1, whichever gave the faster updates. Small networks lose to thread hand-offs and a busy
    machine's other processes, big convolutions gain: it is measured, on this machine and this network.
    A trial's first calls train on one thread; if an update takes under `SMALL_UPDATE_S` there, one it is.
    Otherwise calls alternate between the two until each has trained `trial_updates` updates or, for
    updates that cost a second or more (a big network's, a big batch's), `trial_s` seconds of them; the
    faster is kept, and the trial is run again every `recheck_s` seconds (what else runs may change)."""

    def __init__(self, most: int, fixed: bool = False, trial_updates: int = 64, recheck_s: float = 300.0,
                 free_cores=None, trial_s: float = 2.0):
        """`free_cores()`: cores other processes leave this one now (by default from their CPU time,
        `OthersBusy`): with fewer than `most` (other processes busy on this machine) the learner trains on
        one, and the trial does not count that call."""
        self.most, self.trial_updates, self.recheck_s, self.trial_s = max(1, most), trial_updates, recheck_s, trial_s
        self.fixed = fixed or self.most == 1  # `most` threads, never measured
        self.others = OthersBusy() if free_cores is None and not self.fixed else None
        self.free_cores = free_cores or (self.others.free_cores if self.others else lambda: float(self.most))
        self.trial: dict[int, list[float]] = {}  # threads -> [seconds, updates] in this trial
        self.chosen: int | None = self.most if self.fixed else None
        self.forced = False  # the last call was given one thread because other processes were busy
        self.chosen_at = 0.0

    def threads(self) -> int:
        """The count for the next learner call."""
        import time

        if self.others is not None:
            self.others.mark()
        if not self.fixed and self.chosen is not None and time.monotonic() - self.chosen_at > self.recheck_s:
            self.chosen, self.trial = None, {}
        self.forced = self._busy()
        if self.forced:  # more threads would wait on each other
            return 1
        if self.chosen is not None:
            return self.chosen
        if self.trial.get(1, [0.0, 0])[1] < self._first_updates():  # first: is an update small?
            return 1
        short = [n for n in (1, self.most) if not self._measured(n)]
        return min(short, key=lambda n: self.trial.get(n, [0.0, 0])[1])

    def _busy(self) -> bool:
        """Other processes leave fewer than `most` cores."""
        return not self.fixed and self.free_cores() < self.most - 0.5

    def _first_updates(self) -> int:
        """Updates a trial trains on one thread before anything else."""
        return min(MIN_TRIAL_UPDATES, self.trial_updates)

    def _measured(self, threads: int) -> bool:
        seconds, updates = self.trial.get(threads, [0.0, 0])
        return updates >= self.trial_updates or (seconds >= self.trial_s and updates >= MIN_TRIAL_UPDATES)

    def record(self, threads: int, seconds: float, updates: int) -> None:
        """A call's time training `updates` updates on `threads` threads."""
        import time

        if self.others is not None:
            self.others.read()
        # A call made on one thread for a busy machine, or during which the machine turned busy, says nothing
        # about which count trains faster.
        if self.chosen is not None or updates <= 0 or self.forced or self._busy():
            return
        spent = self.trial.setdefault(threads, [0.0, 0])
        spent[0] += seconds
        spent[1] += updates
        if threads == 1 and spent[1] >= self._first_updates() and seconds / updates < SMALL_UPDATE_S:
            self.chosen, self.chosen_at = 1, time.monotonic()  # this call's: a first call's set-up costs more
            return
        one, most = self.trial.get(1), self.trial.get(self.most)
        if one and most and most[0] / most[1] > 2 * one[0] / one[1]:  # far slower: no need to measure on
            self.chosen, self.chosen_at = 1, time.monotonic()
            return
        if all(self._measured(n) for n in (1, self.most)):
            self.chosen = min((1, self.most), key=lambda n: self.trial[n][0] / self.trial[n][1])
            self.chosen_at = time.monotonic()


class OthersBusy:
    """How many of this process's CPUs other processes keep busy: the CPUs' busy time (/proc/stat) less
    this process's own (/proc/self/stat), so the learner's own threads never count (a load average counts
    them). Two views, the larger taken: over the learner's calls only (`mark` before one, `read` after it,
    pooled until half a second of them is seen: what shares the cores while it trains), and over the last
    minute (what the machine has been doing: a test suite's other process, sync mode's workers, come and
    go between calls). Where /proc is not there, the load average stands in."""

    WINDOW_S = 0.5
    MINUTE_S = 60.0

    def __init__(self):
        self.cores = 0.0  # the newest estimate over the calls; none is taken before the first window
        self.start: tuple[float, float, float] | None = None
        self.pooled = [0.0, 0.0]  # [others' busy CPU-seconds, wall seconds] of the calls since the last estimate
        self.history: list[tuple[float, float, float]] = []  # (when, machine busy, own) at each mark, a minute's

    def free_cores(self) -> float:
        """Cores the other processes leave this one."""
        if not os.path.exists("/proc/stat"):
            try:
                return usable_cpus() - os.getloadavg()[0] + 1.0  # itself, running, counted in the load
            except OSError:
                return 0.0
        return usable_cpus() - max(self.cores, self.minute())

    def minute(self) -> float:
        """Others' cores over the marks of the last minute (0 before 5 s of them)."""
        if len(self.history) < 2 or self.history[-1][0] - self.history[0][0] < 5.0:
            return 0.0
        (t0, machine0, own0), (t1, machine1, own1) = self.history[0], self.history[-1]
        return max(0.0, (machine1 - machine0) - (own1 - own0)) / (t1 - t0)

    def mark(self) -> None:
        self.start = _cpu_seconds()
        if self.start is not None:
            self.history.append(self.start)
            while len(self.history) > 2 and self.start[0] - self.history[1][0] >= self.MINUTE_S:
                self.history.pop(0)

    def read(self) -> None:
        if self.start is None:
            return
        now, then, self.start = _cpu_seconds(), self.start, None
        if now is None:
            return
        wall, machine, own = (a - b for a, b in zip(now, then))
        self.pooled[0] += max(0.0, machine - own)
        self.pooled[1] += wall
        if self.pooled[1] >= self.WINDOW_S:
            self.cores, self.pooled = self.pooled[0] / self.pooled[1], [0.0, 0.0]


def _cpu_seconds() -> tuple[float, float, float] | None:
    """(now, busy CPU-seconds of this process's CPUs, this process's CPU-seconds), or None without /proc."""
    import time

    try:
        tick = os.sysconf("SC_CLK_TCK")
        cpus = {f"cpu{n}" for n in (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ())}
        busy = 0
        with open("/proc/stat") as fh:
            for line in fh:
                name, *fields = line.split()
                if name in cpus:  # user nice system idle iowait irq softirq steal: all but idle and iowait
                    values = [int(v) for v in fields[:8]]
                    busy += sum(values) - values[3] - values[4]
        with open("/proc/self/stat") as fh:
            utime, stime = (int(v) for v in fh.read().rsplit(")", 1)[1].split()[11:13])
        return time.monotonic(), busy / tick, (utime + stime) / tick
    except (OSError, ValueError, IndexError):
        return None


def learner_threads(fixed: int, mode: str, workers: int, cpus: int, deterministic: bool) -> ThreadChoice:
    """A CPU learner's thread choice. `fixed` (learner.threads) > 0: that many. Else between 1 and the cores
    nothing else uses while it trains: all of them in single and sync mode (sampling waits for the learner
    there), those beside the workers in async mode; a deterministic run keeps one (a thread count changes
    how sums are split, and so the last bits of a result)."""
    if fixed:
        return ThreadChoice(fixed, fixed=True)
    if deterministic:
        return ThreadChoice(1)
    return ThreadChoice(cpus if mode in ("single", "sync") else cpus - workers)
