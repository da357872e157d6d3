"""Every role may die: SIGKILLed learner (inside the first checkpoint interval, and after a checkpoint
while a checkpoint waits on it) and parameter server during an async Ape-X run; the run finishes solved
and counts exactly what happened (a role that hangs: tests/runtime/test_hangs.py). A role whose restarts
are used up ends the run with its cause. No clean start prints a Ray warning. A restored learner's weights
replace the lost ones at the parameter server."""
import csv
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

from distrl import train
from tests.runtime.processes import (kill_one_once_logging, pids_of)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")


def newest_updates(run_dir: str) -> int:
    """metrics.csv's newest `updates` (0 before the first row)."""
    path = os.path.join(run_dir, "metrics.csv")
    lines = open(path).read().splitlines() if os.path.exists(path) else []
    if len(lines) < 2:
        return 0
    column = lines[0].split(",").index("updates")
    fields = lines[-1].split(",")
    return int(fields[column]) if len(fields) > column and fields[column].isdigit() else 0


def newest_checkpoint_updates(run_dir: str) -> int | None:
    done = sorted(p for p in glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*")) if os.path.exists(p + "/DONE"))
    return json.load(open(done[-1] + "/meta.json"))["counters"]["updates"] if done else None


def killer(run_dir: str, log: list) -> None:
    """Learner once before any checkpoint; learner again after one, stopped first for longer than the
    checkpoint interval so that the driver's next checkpoint is waiting on it when it dies; then the
    parameter server."""
    metrics = os.path.join(run_dir, "metrics.csv")
    deadline = time.time() + 150

    def wait(cond):
        while time.time() < deadline and not cond():
            time.sleep(0.1)

    wait(lambda: os.path.exists(metrics) and len(open(metrics).read().splitlines()) > 2)
    assert newest_checkpoint_updates(run_dir) is None
    os.kill(pids_of("Learner")[0], signal.SIGKILL)
    log.append(("learner", time.time(), None))
    wait(lambda: newest_checkpoint_updates(run_dir) not in (None, 0))
    time.sleep(1.0)
    wait(lambda: bool(pids_of("Learner")))  # the restarted learner's process, once Ray has started it
    learner = pids_of("Learner")[0]
    os.kill(learner, signal.SIGSTOP)
    at_checkpoint = newest_checkpoint_updates(run_dir)  # none completes while the learner is stopped
    time.sleep(6.0)
    os.kill(learner, signal.SIGKILL)
    log.append(("learner", time.time(), at_checkpoint))
    time.sleep(3.0)
    os.kill(pids_of("ParameterServer")[0], signal.SIGKILL)
    log.append(("parameter_server", time.time(), None))


def test_learner_and_parameter_server_deaths_are_survived(ray_session, tmp_path, capfd):
    run_dir = str(tmp_path / "run")
    log: list = []
    thread = threading.Thread(target=killer, args=(run_dir, log), daemon=True)
    start = time.time()
    thread.start()
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[  # a stop of 6 s is not yet a hang here: it dies first
        "mode=async", "workers=2", "seed=0", "checkpoint.interval_s=4", "stop.max_env_steps=600000",
        "fault.role_timeout_s=30",
        "stop.max_seconds=240", "log.progress=false", "log.tensorboard=false", "log.interval_s=0.25"])
    thread.join(timeout=5)
    assert [name for name, _, _ in log] == ["learner", "learner", "parameter_server"], log
    assert summary["solved"], summary
    assert summary["learner_restarts"] == 2 and summary["parameter_server_restarts"] == 1, summary
    assert summary["updates_lost"] > 0 and summary["failure"] is None
    # One distrl line per death on the console; Ray's own text about them in faults.log only.
    out, err = capfd.readouterr()
    assert err.count("distrl: learner died, restarted ") == 2 and "distrl: parameter server died" in err, err
    assert "A worker died" not in out + err and "(raylet)" not in out + err, out + err
    assert "A worker died" in open(os.path.join(run_dir, "faults.log")).read()
    # After the second kill the learner was restored to the newest checkpoint: its update count may
    # fall back to that checkpoint's, never below it.
    _, killed_at, at_checkpoint = log[1]
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    after = [int(r["updates"]) for r in rows if float(r["wall_s"]) > killed_at - start + 0.5]
    assert after and min(after) >= at_checkpoint


def test_a_role_whose_restarts_are_used_up_ends_the_run_with_its_cause(ray_session, tmp_path):
    run_dir = str(tmp_path / "run")
    thread, killed = kill_one_once_logging(run_dir, "Evaluator")
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[
        "mode=async", "workers=1", "fault.max_role_restarts=0", "stop.max_seconds=90", "eval.target_return=null",
        "log.progress=false", "log.tensorboard=false", "log.interval_s=0.25"])
    thread.join(timeout=5)
    assert killed, summary
    assert summary["stop_reason"] == "role_failure", summary
    assert "evaluator" in summary["failure"] and "restarts are used up" in summary["failure"], summary
    assert time.time() - killed[0][1] < 30, summary  # noticed at once, not after fault.role_timeout_s (120 s)
    assert newest_checkpoint_updates(run_dir) is not None  # the run is resumable




def test_a_clean_start_prints_no_ray_warning(tmp_path):
    """A command of its own (Ray warns once per process): every constructor argument travels with its actor
    (none in the object store: Ray issue 53727 warns for those, and a restart could lose them), and Ray's
    notice about token authentication stays off the console. Every role starts, gradient workers and a
    central inference server included. Raylet's own warnings go to faults.log, those printed before the run
    dir exists too: here its disk monitor's "is over 1% full", as soon as Ray starts (on a nearly full disk
    it says 95%). Ray's log monitor relays it within seconds: the run lasts long enough for that beside the
    suite's other process."""
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "distrl.cli", "train", CARTPOLE, "--mode", "async", "--workers", "1",
                          "--run-dir", str(run_dir), "--set", "learner.num_gradient_workers=2",
                          "--set", "rollout.inference=central", "--set", "stop.max_env_steps=4000",
                          "--set", "log.progress=false", "--set", "log.tensorboard=false"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "RAY_local_fs_capacity_threshold": "0.01",
                              "RAY_local_fs_monitor_interval_ms": "100"})
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr
    assert len(out.stdout.splitlines()) == 2, out.stdout  # the result and where it is
    faults = (run_dir / "faults.log").read_text()
    assert "(raylet) file_system_monitor" in faults and "is over 1% full" in faults, faults


def test_a_restored_learners_weights_replace_newer_ones_at_the_parameter_server(ray_session):
    import numpy as np
    import ray

    from distrl.runtime.actors import ParameterServer

    ps = ParameterServer.remote()
    assert ray.get(ps.pull_if_changed.remote(-1)) is None  # nothing published yet
    w = {"w": np.zeros(2, np.float32)}
    ray.get(ps.push.remote(10, w))
    ray.get(ps.push.remote(5, {"w": np.ones(2, np.float32)}))  # stale: ignored
    version, weights = ray.get(ps.pull_if_changed.remote(-1))
    assert version == 10 and not weights["w"].any()
    ray.get(ps.push.remote(5, {"w": np.ones(2, np.float32)}, True))  # a restored learner's
    assert ray.get(ps.pull_if_changed.remote(5)) is None
    version, weights = ray.get(ps.pull_if_changed.remote(10))  # a worker acting with the lost weights pulls
    assert version == 5 and weights["w"].all()
    ray.kill(ps)
