"""One trial of a sweep (`distrl tune`), and what the sweep's driver does for its trials.

A trial is a normal distrl run with its own run dir, SWEEP_DIR/runs/<trial id>_<its values>. While the run
trains in the trial's thread, a reporter thread reads each new metrics.csv row and reports it to Tune (the
eval return, env steps, ...), so a scheduler such as ASHA can judge the trial as it goes.

Stopping a trial early: Tune ends a stopped trial's process without telling it (no exception, no cleanup
code runs), which would leave a run without its final checkpoint, summary.json or finished tracker runs.
So the scheduler here (`EarlyStopASHA`) turns ASHA's "stop" into a request written to the trial's run dir
(RUN_DIR/stop_request.json); the run reads it at its next metrics row and ends as at any stop condition,
with stop_reason `early_stopped`, a checkpoint and summary.json; then the trial returns.

A trial started again (a resumed sweep) does not train twice: a run dir holding summary.json is reported
as it is, one holding a checkpoint is resumed from it (`distrl resume`), and anything else starts afresh.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import threading
import time

from ray import tune
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from distrl.checkpoint import CheckpointError
from distrl.checkpoint.lock import LOCK, RunDirBusy, RunDirLock
from distrl.config import ConfigError
from distrl.observe.metrics import request_stop

RUNS = "runs"  # SWEEP_DIR/runs/<trial>: the trials' run dirs
WRITER_WAIT_S = 60.0  # how long a resumed trial waits for a killed sweep's process to leave its run dir
TRIAL_FILE = "trial.json"  # RUN_DIR/trial.json: the trial's id, its values, and each time it was started
REPORTED = ("wall_s", "env_steps", "updates", "eval_return_mean", "eval_success_rate", "best_eval_return",
            "train_return_mean")


def trial_dir_name(trial_id: str, config: dict) -> str:
    """<trial id>_<key=value,...>: a run dir name that says which values the trial tried."""
    values = ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(config.items()))
    return re.sub(r"[^A-Za-z0-9_.,=+-]+", "-", f"{trial_id}_{values}")[:120]


def trial_run_dir(sweep_dir: str, trial_id: str, config: dict) -> str:
    return os.path.join(sweep_dir, RUNS, trial_dir_name(trial_id, config))


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class Reporter(threading.Thread):
    """Reports each new metrics.csv row of `run_dir` that has the sweep's metric to Tune."""

    def __init__(self, run_dir: str, metric: str, poll_s: float = 0.1):
        super().__init__(name="distrl-tune-reporter", daemon=True)
        self.run_dir, self.metric, self.poll_s = run_dir, metric, poll_s
        self.last: dict = {}  # the last row reported
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.poll_s):
            self.poll()

    def poll(self) -> None:
        try:
            with open(os.path.join(self.run_dir, "metrics.csv"), newline="") as fh:
                rows = list(csv.DictReader(fh))
        except OSError:
            return  # not written yet
        seen = self.last.get("wall_s", -math.inf)
        for row in rows:
            values = {k: v for k in REPORTED if (v := _number(row.get(k))) is not None}
            # A resumed run's rows were cut back to its checkpoint: only rows after the last reported count.
            if values.get("wall_s", -math.inf) > seen and self.metric in values and "env_steps" in values:
                tune.report({**values, "final": False})
                self.last, seen = values, values["wall_s"]

    def finish(self) -> None:
        """Stop, after reporting the rows written so far."""
        self._done.set()
        if self.is_alive():
            self.join()
        self.poll()


def _note_start(run_dir: str, trial_id: str, config: dict) -> None:
    path = os.path.join(run_dir, TRIAL_FILE)
    try:
        with open(path) as fh:
            note = json.load(fh)
    except (OSError, ValueError):
        note = {"trial_id": trial_id, "config": config, "starts": 0}
    note["starts"] += 1
    os.makedirs(run_dir, exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        json.dump(note, fh)
    os.replace(path + ".tmp", path)


def _summary(run_dir: str) -> dict | None:
    try:
        with open(os.path.join(run_dir, "summary.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def wait_for_writer(run_dir: str, timeout_s: float = WRITER_WAIT_S) -> None:
    """Return once no process holds the run dir's lock. A trial of a sweep that was killed may still be
    ending when the sweep resumes: Ray gives each worker a process group of its own, and a worker notices
    its raylet's death only after a while, writing into the run dir meanwhile. Still held after
    `timeout_s`: RunDirBusy naming the holder's pid, and the run dir is left as it is."""
    deadline = time.monotonic() + timeout_s
    while os.path.isdir(run_dir):
        try:
            RunDirLock(run_dir).acquire().release()
            return
        except RunDirBusy:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _train_or_resume(run_dir: str, sweep: dict, overrides: list[str], train, resume) -> dict:
    if os.path.isdir(os.path.join(run_dir, "checkpoints")):
        try:
            return resume(run_dir, address=sweep["address"])
        except RunDirBusy:
            raise  # another process writes there: its files are not ours to clear
        except (ConfigError, CheckpointError):
            pass  # no complete checkpoint yet: start again
    if os.path.exists(os.path.join(run_dir, "config.yaml")):  # a start that never reached a checkpoint
        for name in os.listdir(run_dir):
            if name not in (TRIAL_FILE, LOCK):  # a lock file in use stays one file
                path = os.path.join(run_dir, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    return train(json.loads(json.dumps(sweep["config"])), overrides=overrides, run_dir=run_dir,
                 address=sweep["address"])


def final_result(summary: dict, last: dict, metric: str) -> dict:
    """The trial's last report: its last metrics row with the run's summary (how it ended)."""
    result = {**last, "final": True, "solved": bool(summary.get("solved")),
              "time_to_solve_s": summary.get("time_to_solve_s") or math.nan,
              "stop_reason": str(summary.get("stop_reason")), "env_steps": summary.get("env_steps", 0)}
    value = summary.get(metric, last.get(metric))
    result[metric] = math.nan if value is None else float(value)
    return result


def trial_main(config: dict, sweep: dict | None = None, train=None, resume=None) -> None:
    """Tune's function trainable: one distrl run with the trial's values as overrides."""
    if os.path.isdir(sweep.get("cwd", "")):
        os.chdir(sweep["cwd"])  # relative paths in the config mean what they meant where the sweep started
    trial_id = tune.get_context().get_trial_id()
    run_dir = trial_run_dir(sweep["dir"], trial_id, config)
    _note_start(run_dir, trial_id, config)
    overrides = [f"{k}={json.dumps(v)}" for k, v in config.items()] + ["log.progress=false"]
    wait_for_writer(run_dir)  # before reading it: a killed sweep's run may still finish there
    summary = _summary(run_dir)
    reporter = Reporter(run_dir, sweep["metric"])
    if summary is None:
        reporter.start()
        try:
            summary = _train_or_resume(run_dir, sweep, overrides, train, resume)
        finally:
            reporter.finish()
    else:
        reporter.poll()
    tune.report(final_result(summary, reporter.last, sweep["metric"]))


class EarlyStopASHA(ASHAScheduler):
    """ASHA whose "stop" is a request the trial's run reads (RUN_DIR/stop_request.json), so the run ends
    cleanly (checkpoint, summary.json, trackers) with stop_reason `early_stopped`; Tune itself never
    kills the trial. A trial that reached the budget (max_t) ends by itself and is not asked."""

    def __init__(self, sweep_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.sweep_dir = sweep_dir
        self.asked: dict[str, float] = {}  # trial id -> the time attribute when it was asked to stop

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if result.get("final") or trial.trial_id in self.asked:
            return TrialScheduler.CONTINUE
        action = super().on_trial_result(tune_controller, trial, result)
        at = result.get(self._time_attr)
        if action == TrialScheduler.STOP and at is not None and at < self._max_t:
            self.asked[trial.trial_id] = at
            request_stop(trial_run_dir(self.sweep_dir, trial.trial_id, trial.config), "early_stopped",
                         by="asha", at={self._time_attr: at}, metric={self._metric: result.get(self._metric)})
        return TrialScheduler.CONTINUE


def release_orphan_groups() -> int:
    """Remove placement groups whose creating actor is dead (a trial's run reserved them and the trial
    ended without removing them): Ray keeps them, holding their resources, until the sweep's driver exits
    (ray-project/ray#65881). Returns how many were removed."""
    import ray
    from ray._private.state import state
    from ray.core.generated import gcs_pb2
    from ray.util.placement_group import PlacementGroup

    removed = 0
    for raw in state._connect_and_get_accessor().get_placement_group_table():
        data = gcs_pb2.PlacementGroupTableData.FromString(raw)
        creator = ray.ActorID(data.creator_actor_id) if data.creator_actor_id else None
        if creator is None or creator.is_nil() or not data.creator_actor_dead or data.is_detached:
            continue  # made by a driver (Tune's own trial groups), alive, or meant to outlive its creator
        if data.state == gcs_pb2.PlacementGroupTableData.REMOVED:
            continue
        ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID(data.placement_group_id)))
        removed += 1
    return removed


class SweepCallback(tune.Callback):
    """One line per trial as it ends, and its leftover placement groups released."""

    def on_trial_complete(self, iteration, trials, trial, **info):
        last = trial.last_result or {}
        print(f"distrl tune: trial {trial.trial_id} ended ({last.get('stop_reason', '?')}): "
              f"{json.dumps(trial.config)}", flush=True)
        self._release()

    def on_trial_error(self, iteration, trials, trial, **info):
        print(f"distrl tune: trial {trial.trial_id} failed: {json.dumps(trial.config)}", flush=True)
        self._release()

    @staticmethod
    def _release() -> None:
        try:
            release_orphan_groups()
        except Exception:  # noqa: BLE001 - Ray's internals changed: the groups stay until the sweep ends
            pass
