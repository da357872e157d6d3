"""Hung processes (SIGSTOP: alive, answering nothing) are noticed in every mode: a rollout worker in async
mode while the others deliver, a gradient worker while the learner waits for its shard, single mode's
evaluator. Each is ended within fault.role_timeout_s, restarted, counted once, and reported in one console
line; the run goes on."""
import csv
import os
import signal
import threading
import time

from distrl import train
from tests.runtime.processes import PACED, new_pids, resume_if_stopped, snapshot, started_at, stop_once_back

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
PPO = os.path.join(ROOT, "configs", "ppo_cartpole.yaml")
HANG_TIMEOUT_S = 10  # fault.role_timeout_s, as in the chaos run: a started role answers its health check in ms
# (a start, or a restart, has its own budget of at least a minute)
QUIET = ["log.progress=false", "log.tensorboard=false", "log.interval_s=0.25", f"fault.role_timeout_s={HANG_TIMEOUT_S}"]


class Stopper(threading.Thread):
    """SIGSTOPs one process of `name` that this run started, once the run has written a few metrics rows (and
    `when(run_dir)` holds), and keeps it stopped; `resume()` (at the test's end) lets it go on if the run did
    not end it."""

    def __init__(self, run_dir: str, name: str, when=lambda run_dir: True):
        super().__init__(daemon=True)
        self.run_dir, self.name, self.when = run_dir, name, when
        self.before, self.stopped = snapshot(name), None  # (pid, when, its start time)
        self.done = threading.Event()

    def run(self) -> None:
        metrics, deadline = os.path.join(self.run_dir, "metrics.csv"), time.time() + 120
        while time.time() < deadline and not self.done.is_set():
            if os.path.exists(metrics) and len(open(metrics).readlines()) > 4 and self.when(self.run_dir):
                ours = new_pids(self.name, self.before)
                if ours:
                    self.stopped = (ours[0], time.time(), started_at(ours[0]))
                    os.kill(ours[0], signal.SIGSTOP)
                    return
            time.sleep(0.1)

    def resume(self) -> None:
        self.done.set()
        self.join(timeout=5)
        if self.stopped is not None:
            resume_if_stopped(self.stopped[0], self.stopped[2])


def console_events(err: str) -> list[str]:
    return [line.removeprefix("distrl: ") for line in err.splitlines() if line.startswith("distrl: ")]


def test_a_hung_rollout_worker_in_async_mode_is_ended_restarted_and_counted(ray_session, tmp_path, capfd):
    """The other worker delivers all along (no target: the run would solve on it alone; it is stopped once the
    hung one is back)."""
    run_dir, done = str(tmp_path / "run"), threading.Event()
    stopper = Stopper(run_dir, "RolloutWorker")
    stopper.start()
    stop = threading.Thread(target=stop_once_back, args=(run_dir, done), daemon=True)
    stop.start()
    start = time.time()
    try:
        summary = train(CARTPOLE, run_dir=run_dir, start_time=start, overrides=[
            "mode=async", "workers=2", "seed=0", "stop.max_seconds=200", "eval.target_return=null", *PACED, *QUIET])
    finally:
        done.set()
        stop.join(timeout=5)
        stopper.resume()
    assert stopper.stopped is not None, summary
    assert summary["stop_reason"] == "interrupted" and summary["failure"] is None, summary
    assert summary["worker_restarts"] == 1 and summary["workers_lost"] == 0, summary
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    stopped_at = stopper.stopped[1] - start
    during = [int(r["env_steps"]) for r in rows if stopped_at + 1 < float(r["wall_s"]) < stopped_at + HANG_TIMEOUT_S]
    assert during and during[-1] > during[0], rows  # the other worker delivered while this one hung
    events = console_events(capfd.readouterr().err)
    assert len(events) == 1 and events[0].startswith("worker ") and \
        f" hung (no answer within {HANG_TIMEOUT_S} s), ended, restarted in " in events[0], events


def test_a_hung_gradient_worker_is_ended_restarted_and_counted_without_a_traceback(ray_session, tmp_path, capfd):
    """The learner's step waits on its shard: the driver, waiting on the learner, ends the silent gradient
    worker; Ray restarts it and runs the shard again there, and the updates go on. The learner is not blamed.
    (No target: PPO may solve CartPole on the weights it had when the worker hung, before the restart.)"""
    run_dir, done = str(tmp_path / "run"), threading.Event()
    stopper = Stopper(run_dir, "GradientWorker")
    stopper.start()
    stop = threading.Thread(target=stop_once_back, args=(run_dir, done, 12), daemon=True)
    stop.start()
    start = time.time()
    try:
        summary = train(PPO, run_dir=run_dir, start_time=start, overrides=[
            "mode=sync", "workers=2", "seed=0", "learner.num_gradient_workers=2", "stop.max_seconds=200",
            "eval.target_return=null", *QUIET])
    finally:
        done.set()
        stop.join(timeout=5)
        stopper.resume()
    assert stopper.stopped is not None, summary
    assert summary["stop_reason"] == "interrupted" and summary["failure"] is None, summary
    assert summary["gradient_worker_restarts"] == 1 and summary["learner_restarts"] == 0, summary
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    ended_by = stopper.stopped[1] - start + HANG_TIMEOUT_S
    before = [int(r["updates"]) for r in rows if float(r["wall_s"]) < ended_by]
    assert before and int(rows[-1]["updates"]) > before[-1], rows  # updates went on after the restart
    assert not os.path.exists(os.path.join(run_dir, "failure.log"))
    err = capfd.readouterr().err
    events = console_events(err)
    assert len(events) == 1 and events[0].startswith("gradient worker ") and \
        f" hung (no answer within {HANG_TIMEOUT_S} s), ended, restarted in " in events[0], events
    assert "Traceback" not in err, err


def test_single_modes_hung_evaluator_is_ended_restarted_and_the_run_still_solves_on_time(tmp_path, capfd):
    """Stopped right after its first result: the driver never waits on it (training goes on), ends it within
    fault.role_timeout_s, and the restarted evaluator finds the run solved."""
    run_dir = str(tmp_path / "run")
    first_result = lambda run_dir: os.path.exists(os.path.join(run_dir, "checkpoints", "best.json"))  # noqa: E731
    stopper = Stopper(run_dir, "distrl-eval", when=first_result)
    stopper.start()
    start = time.time()
    try:
        summary = train(CARTPOLE, run_dir=run_dir, start_time=start, overrides=[
            "mode=single", "stop.max_seconds=150", *QUIET])
    finally:
        stopper.resume()
    assert stopper.stopped is not None, summary
    assert summary["solved"] and summary["failure"] is None, summary
    assert summary["evaluator_restarts"] == 1, summary
    assert summary["time_to_solve_s"] > stopper.stopped[1] - start + HANG_TIMEOUT_S  # solved by the new one
    assert time.time() - start < 150 + 10
    events = console_events(capfd.readouterr().err)
    assert len(events) == 1 and events[0].startswith(
        f"evaluator hung (no sign of life for {HANG_TIMEOUT_S} s), ended, restarted in "), events
