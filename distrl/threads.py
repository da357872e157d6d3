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


class ThreadChoice:
    """How many torch threads a CPU learner trains with: `most` (the cores nothing else uses while it
    trains), or 1, whichever gave the faster updates. Small networks lose to thread hand-offs and a busy
    machine's other processes, big convolutions gain: it is measured, on this machine and this network.
    Calls alternate between the two until each has trained `trial_updates` updates, the faster is kept,
    and the trial is run again every `recheck_s` seconds (what else runs may change)."""

    def __init__(self, most: int, fixed: bool = False, trial_updates: int = 64, recheck_s: float = 300.0,
                 free_cores=None):
        """`free_cores()`: cores other processes leave this one now (by default from the load average): with
        fewer than `most` (other processes busy on this machine) the learner trains on one, unmeasured."""
        self.most, self.trial_updates, self.recheck_s = max(1, most), trial_updates, recheck_s
        self.free_cores = free_cores or _free_cores
        self.fixed = fixed or self.most == 1  # `most` threads, never measured
        self.trial: dict[int, list[float]] = {}  # threads -> [seconds, updates] in this trial
        self.chosen: int | None = self.most if self.fixed else None
        self.chosen_at = 0.0

    def threads(self) -> int:
        """The count for the next learner call."""
        import time

        if not self.fixed and self.chosen is not None and time.monotonic() - self.chosen_at > self.recheck_s:
            self.chosen, self.trial = None, {}
        if not self.fixed and self.free_cores() < self.most - 0.5:  # busy: more threads would wait on each other
            return 1
        if self.chosen is not None:
            return self.chosen
        short = [n for n in (1, self.most) if self.trial.get(n, [0.0, 0])[1] < self.trial_updates]
        return min(short, key=lambda n: self.trial.get(n, [0.0, 0])[1])

    def record(self, threads: int, seconds: float, updates: int) -> None:
        """A call's time training `updates` updates on `threads` threads."""
        import time

        if self.chosen is not None or updates <= 0:
            return
        spent = self.trial.setdefault(threads, [0.0, 0])
        spent[0] += seconds
        spent[1] += updates
        one, most = self.trial.get(1), self.trial.get(self.most)
        if one and most and most[0] / most[1] > 2 * one[0] / one[1]:  # far slower: no need to measure on
            self.chosen, self.chosen_at = 1, time.monotonic()
            return
        if all(self.trial.get(n, [0.0, 0])[1] >= self.trial_updates for n in (1, self.most)):
            self.chosen = min((1, self.most), key=lambda n: self.trial[n][0] / self.trial[n][1])
            self.chosen_at = time.monotonic()


def _free_cores() -> float:
    """Cores the last minute's load average leaves this process (itself, running, counted in the load)."""
    try:
        return usable_cpus() - os.getloadavg()[0] + 1.0
    except OSError:
        return 0.0


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
