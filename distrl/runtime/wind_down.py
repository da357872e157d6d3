"""A run's end, timed from its stop's moment (its budget's end, the signal, the solving evaluation): the
steps the driver takes then (the learner's last calls, a last evaluation, a checkpoint, the trace) each get
what is left of `WIND_DOWN_S`, so that a run has ended within seconds of its stop whatever its roles do.

At the stop the roles' processes that do not answer a heartbeat (hung, or coming back from a death) are
ended, not waited for (`Roles.wind_down`); a step that does not fit, or that needs one of them, is skipped.
Each skip is one `distrl:` line (console and RUN_DIR/faults.log) and an entry of summary.json's
`skipped_at_stop`."""
from __future__ import annotations

import os
import threading
import time

from distrl.checkpoint import save_json
from distrl.core import Roles, Stopping
from distrl.runtime.counters import note_restarts
from distrl.runtime.faultlog import FaultLog
from distrl.runtime.rows import run_summary

WIND_DOWN_S = 7.0  # stop -> summary.json; closing the roles and the process's exit take the rest of 10 s
FAULT_WIND_DOWN_S = 30.0  # after a fault (a role lost, an error): the last checkpoint may wait this long
ABORT_WIND_DOWN_S = 5.0  # after a second interrupt


def checkpoint_reserve(checkpoint_s: list[float]) -> float:
    """Seconds of the wind-down kept for its checkpoint: twice the longest one so far, 1 to 4 s."""
    return min(4.0, max(1.0, 2.0 * max(checkpoint_s, default=0.5)))


class WindDown:
    """The wind-down of one run: its deadline, what it skipped and the processes it ended."""

    def __init__(self, roles: Roles, faults: FaultLog, moment: float, seconds: float):
        self.roles, self.faults = roles, faults
        self.moment, self.end_by = moment, moment + seconds
        self.skipped: dict[str, str] = {}  # step -> why
        self.ended = roles.wind_down(self.end_by)  # silent at the stop: ended, not waited for
        if self.ended:
            self.faults.event(f"at the stop: {', '.join(self.ended)} silent (hung, or coming back), ended "
                              f"without waiting")

    def cut_to(self, seconds: float) -> None:
        """Bring the deadline forward to `seconds` from now (a second interrupt)."""
        self.end_by = min(self.end_by, time.time() + seconds)
        self.roles.wind_down(self.end_by)

    def left(self) -> float:
        return max(0.0, self.end_by - time.time())

    def step(self, name: str, run, until: float | None = None, patient_s: float | None = None):
        """`run()` with no wait on a role past `until` (the deadline by default): its result, or None and a
        skip when it was cut short (`Stopping`). `patient_s`: it may instead take up to that long, past the
        deadline, for as long as the roles it waits on answer their heartbeats."""
        if patient_s is not None:
            self.roles.wind_down(max(self.end_by, time.time() + patient_s), watch_hangs=True)
        else:
            self.roles.wind_down(min(until or self.end_by, self.end_by))
        try:
            return run()
        except Stopping as e:
            self.skip(name, str(e))
            return None
        finally:
            self.roles.wind_down(self.end_by)
            if patient_s is not None:  # what follows it (the trace, the summary) gets a moment of its own
                self.end_by = max(self.end_by, time.time() + 1.0)

    def skip(self, name: str, why: str) -> None:
        if name not in self.skipped:
            self.skipped[name] = why
            self.faults.event(f"{name} skipped at the stop: {why}")

    def summary(self) -> dict:
        return {"skipped_at_stop": dict(self.skipped), "ended_at_stop": list(self.ended),
                "stop_to_summary_s": round(time.time() - self.moment, 3)}


def finish(d, reason: str) -> dict:
    """Wind driver `d`'s run down and write what it leaves: a last log row, a checkpoint, the trace,
    summary.json. Timed from the stop's moment (`WindDown`): what does not fit is skipped and said. After
    a fault each step is attempted and may fail on its own; after a second interrupt only what takes no
    waiting is done, and the checkpoint only if it is written within seconds."""
    healthy = reason not in ("role_failure", "error") and not d.abort
    d.held.passed(time.time(), workers=False, learner=False)  # the wind-down is no side's wait
    try:
        if healthy and reason == "max_env_steps":
            d._attempt(d._catch_up)  # the ratio holds at the end: before the wind-down's clock starts
        seconds = WIND_DOWN_S if healthy else ABORT_WIND_DOWN_S if d.abort else FAULT_WIND_DOWN_S
        d.wind = WindDown(d.roles, d.faults, d._stop_moment(reason) if healthy else time.time(), seconds)
        if healthy:
            _last_training_and_evaluation(d, reason)
    except KeyboardInterrupt:  # a second interrupt while winding down: skip the waiting
        d.abort, healthy = True, False
        d.failure = "stopped at once by a second interrupt"
        d.wind = d.wind or WindDown(d.roles, d.faults, time.time(), ABORT_WIND_DOWN_S)
        d.wind.cut_to(ABORT_WIND_DOWN_S)
    restarts = d.roles.restarts()
    try:
        restarts = d._attempt(lambda: d.roles.restarts(exact=healthy)) or restarts
        note_restarts(d.c, restarts)
        d._log_row()
        _last_checkpoint(d, healthy)
        d.interruptible = False
    except KeyboardInterrupt:  # a second interrupt during the last checkpoint: the summary still says so
        d.interruptible = False
        d.abort, d.failure = True, "stopped at once by a second interrupt"
        d.wind.skip("checkpoint", "cut short by a second interrupt")
    summary = run_summary(d, reason, restarts, d._replay_bytes() if healthy and not d.abort else None)
    if not d.abort:
        d.wind.step("trace", lambda: d._attempt(d._write_trace, raise_stop=True))
    summary.update(d.wind.summary())
    save_json(os.path.join(d.run_dir, "summary.json"), summary)
    d.logger.close(summary)  # the trackers get the summary and the best checkpoint
    return summary


def _last_training_and_evaluation(d, reason: str) -> None:
    """The learner's calls in flight, and a last score for runs that stopped early (so that best_eval_return
    means something), within the wind-down less its checkpoint's share."""
    w = d.wind
    until = w.end_by - checkpoint_reserve(d.checkpoint_s)
    w.step("final training", lambda: d._attempt(
        lambda: [d._count_training(s) for s in d.roles.train(0, final=True)], raise_stop=True), until)
    if d.roles.updates_in_flight():
        w.skip("final training", f"{d.roles.updates_in_flight()} updates in flight not counted")
    if reason != "solved" and d.c.updates > 0:
        w.step("final evaluation", lambda: d._attempt(lambda: _last_evaluation(d), raise_stop=True), until)


def _last_evaluation(d) -> None:
    evaluations = d.c.evaluations
    if not d.roles.eval_busy():
        d.roles.submit_eval(d.c.env_steps, wait=True)
    d._evaluate(block=True)
    if d.c.evaluations == evaluations:
        raise Stopping("the evaluator was silent at the stop" if "evaluator" in d.wind.ended else "no result in time")


def _last_checkpoint(d, healthy: bool) -> None:
    """A resumable run, whatever stopped it: after a healthy stop, however long its roles take to write it
    (up to checkpoint.at_stop_s; a role that hangs meanwhile is ended and cuts it short), said in one line
    when that is past the wind-down; after a fault within the wind-down; after a second interrupt, at once."""
    if d.abort:
        d._attempt(lambda: d._checkpoint(attempts=2), within_s=d.wind.left())
        return
    if not healthy:
        d.wind.step("checkpoint", lambda: d._attempt(lambda: d._checkpoint(attempts=2), raise_stop=True))
        return
    w = d.wind
    late = threading.Timer(w.left(), lambda: w.faults.event(
        "the checkpoint at the stop takes longer than the wind-down: waiting for it (a second interrupt cuts it short)"))
    late.daemon = True
    late.start()
    try:
        w.step("checkpoint", lambda: d._attempt(lambda: d._checkpoint(attempts=2), raise_stop=True),
               patient_s=d.cfg.checkpoint.at_stop_s)
    finally:
        late.cancel()
