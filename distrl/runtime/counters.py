"""What the driver counts over a run, and how the counters go into a checkpoint and come back."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from distrl.core import Restarts


class Reservoir:
    """A uniform sample of at most `size` values from a stream (Vitter's algorithm R).

    Run-long lag percentiles from bounded memory.
    """

    def __init__(self, size: int = 20_000, seed: int = 0):
        self.buf = np.empty(size)
        self.seen = 0
        self.rng = np.random.default_rng(seed)

    def extend(self, xs) -> None:
        for x in xs:
            slot = self.seen if self.seen < len(self.buf) else int(self.rng.integers(0, self.seen + 1))
            if slot < len(self.buf):
                self.buf[slot] = x
            self.seen += 1

    def values(self) -> np.ndarray:
        return self.buf[:min(self.seen, len(self.buf))]


@dataclass
class Counters:
    """Everything the driver counts; one metrics.csv row is a snapshot of this."""

    env_steps: int = 0
    updates: int = 0
    consumed: int = 0  # batches the learner took (updates + dropped stale gradients)
    dropped: int = 0
    worker_restarts: int = 0
    restarts: dict = field(default_factory=dict)  # per role, as summary.json's Restarts: what a resume adds to
    external: dict = field(default_factory=dict)  # the simulator server's counts (clients: connected now)
    fragments_dropped: int = 0
    env_errors: int = 0
    episodes: int = 0
    fragments: int = 0
    version: int = 0
    evaluations: int = 0
    inserts: int = 0   # items stored (rate limiter)
    samples: int = 0   # items sampled by the learner (rate limiter)
    updates_lost: int = 0  # updates a dead learner made after its newest checkpoint (redone, never double-counted)
    nonfinite_updates: int = 0  # updates skipped: NaN or inf loss or gradient
    nonfinite_streak: int = 0   # of those, in a row up to now
    poisoned: bool = False      # the learner's weights went non-finite (not published or checkpointed)
    workers_blocked_s: float = 0.0  # wall time the driver held workers back (rate limiter or a full queue)
    learner_blocked_s: float = 0.0  # wall time the learner sat idle with no updates allowed
    best_eval: float = -math.inf
    solved_at: float | None = None
    eval_last: dict | None = None
    recent_returns: list = field(default_factory=list)
    # Samples of the current log interval (not checkpointed):
    lags: list = field(default_factory=list)
    all_lags: Reservoir = field(default_factory=Reservoir)
    loss_sum: float = 0.0
    loss_n: int = 0
    learner_scalars: dict = field(default_factory=dict)  # name -> [sum, count] since the last log row
    ready: list = field(default_factory=list)
    late: list = field(default_factory=list)


TRANSIENT = ("lags", "all_lags", "ready", "late", "learner_scalars")


class HeldTime:
    """Wall time the driver held each side back (`Counters.workers_blocked_s`, `learner_blocked_s`), charged
    after the fact: at the end of each loop pass, to the sides the pass before it held, and at every metrics
    row too, so that a row's share is of its own interval only (between 0 and 1), never of time before it."""

    def __init__(self, c: Counters, now: float):
        self.c, self.last = c, now
        self.workers = self.learner = False  # which side the last pass held back
        self.row_at, self.row_blocked = now, (c.workers_blocked_s, c.learner_blocked_s)

    def charge(self, now: float) -> None:
        dt, self.last = max(0.0, now - self.last), max(self.last, now)
        self.c.workers_blocked_s += dt if self.workers else 0.0
        self.c.learner_blocked_s += dt if self.learner else 0.0

    def passed(self, now: float, workers: bool, learner: bool) -> None:
        """A loop pass ended at `now`, holding back the workers and/or the learner from now on."""
        self.charge(now)
        self.workers, self.learner = workers, learner

    def shares(self, now: float) -> tuple[float, float]:
        """(workers', learner's) share of the time since the last row held back; a row is taken at `now`."""
        self.charge(now)
        dt = max(now - self.row_at, 1e-9)
        blocked = (self.c.workers_blocked_s, self.c.learner_blocked_s)
        w, l = ((b - a) / dt for a, b in zip(self.row_blocked, blocked))
        self.row_at, self.row_blocked = now, blocked
        return w, l


def _plain(x):
    """numpy scalars/arrays -> python, recursively: checkpoint metadata must be JSON-exact."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


def counters_to_meta(c: Counters) -> dict:
    d = _plain({f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name not in TRANSIENT})
    d["best_eval"] = None if d["best_eval"] == -math.inf else d["best_eval"]
    return d


def counters_from_meta(meta: dict) -> Counters:
    c = Counters(**{k: v for k, v in meta.items() if k in {f.name for f in dataclasses.fields(Counters)}})
    c.best_eval = -math.inf if c.best_eval is None else c.best_eval
    return c


def restarts_in(state: dict) -> Restarts:
    """The role restarts a checkpoint recorded (none for a checkpoint without them): a resumed run counts on
    from there, so summary.json's restarts are the whole run's."""
    counted = ((state.get("meta") or {}).get("counters") or {}).get("restarts") or {}
    known = {f.name for f in dataclasses.fields(Restarts)} - {"workers_lost"}  # lost workers are this run's
    return Restarts(**{k: int(v) for k, v in counted.items() if k in known})


def plus(a: Restarts, b: Restarts) -> Restarts:
    """Restarts `a` and then `b` (workers lost: `b`'s, a state rather than a count)."""
    return Restarts(**{f.name: getattr(b, f.name) + (0 if f.name == "workers_lost" else getattr(a, f.name))
                       for f in dataclasses.fields(Restarts)})


def note_restarts(c: Counters, restarts: Restarts) -> None:
    """Keep the roles' restarts in the counters: metrics.csv's worker_restarts, and what a checkpoint records."""
    c.worker_restarts, c.restarts = restarts.workers, dataclasses.asdict(restarts)
