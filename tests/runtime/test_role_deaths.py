"""Every role may die: SIGKILLed learner (inside the first checkpoint interval, and after a checkpoint while
a checkpoint waits on it) and parameter server during an async Ape-X run; the run finishes solved and counts
what happened. A role whose restarts are used up, or that hangs, ends the run with its cause. A restored
learner's weights replace the lost ones at the parameter server."""
import csv
import glob
import json
import os
import signal
import threading
import time

from distrl import train
from tests.runtime.processes import descends_from_us, kill_one_once_logging, pids_of, started_at

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")


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
    learner = pids_of("Learner")[0]
    os.kill(learner, signal.SIGSTOP)
    at_checkpoint = newest_checkpoint_updates(run_dir)  # none completes while the learner is stopped
    time.sleep(6.0)
    os.kill(learner, signal.SIGKILL)
    log.append(("learner", time.time(), at_checkpoint))
    time.sleep(3.0)
    os.kill(pids_of("ParameterServer")[0], signal.SIGKILL)
    log.append(("parameter_server", time.time(), None))


def test_learner_and_parameter_server_deaths_are_survived(ray_session, tmp_path):
    run_dir = str(tmp_path / "run")
    log: list = []
    thread = threading.Thread(target=killer, args=(run_dir, log), daemon=True)
    start = time.time()
    thread.start()
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[
        "mode=async", "workers=2", "seed=0", "checkpoint.interval_s=4", "stop.max_env_steps=600000",
        "stop.max_seconds=240", "log.progress=false", "log.tensorboard=false", "log.interval_s=0.25"])
    thread.join(timeout=5)
    assert [name for name, _, _ in log] == ["learner", "learner", "parameter_server"], log
    assert summary["solved"], summary
    assert summary["learner_restarts"] >= 2 and summary["parameter_server_restarts"] >= 1, summary
    assert summary["updates_lost"] > 0 and summary["failure"] is None
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


HANG_TIMEOUT_S = 15  # fault.role_timeout_s: above a role's start-up on a loaded machine (every role imports torch)


def test_a_role_that_hangs_ends_the_run_at_once_naming_it(ray_session, tmp_path, capfd):
    """Sync mode, after a checkpoint: the replay server is stopped (SIGSTOP: alive, answering nothing) for good.
    Ray restarts only dead processes, so the run ends once fault.role_timeout_s has passed (not after a
    second wait on it while winding down): stop_reason role_failure, the cause in one line naming the replay
    server (not the learner, which waits on it and so stops answering too), summary.json, the newest
    checkpoint to resume from, and no traceback."""
    run_dir, done, stopped = str(tmp_path / "run"), threading.Event(), {}
    before = {(pid, started_at(pid)) for pid in pids_of("ReplayServer")}  # an earlier test's may still be exiting

    def stop_replay():
        deadline = time.time() + 90
        while time.time() < deadline and newest_checkpoint_updates(run_dir) is None and not done.is_set():
            time.sleep(0.1)
        ours = [pid for pid in pids_of("ReplayServer") if (pid, started_at(pid)) not in before]
        if ours and not done.is_set():
            os.kill(ours[0], signal.SIGSTOP)
            stopped.update(pid=ours[0], at=time.time())

    thread = threading.Thread(target=stop_replay, daemon=True)
    thread.start()
    try:
        summary = train(CARTPOLE, run_dir=run_dir, overrides=[
            "mode=sync", "workers=2", f"fault.role_timeout_s={HANG_TIMEOUT_S}", "checkpoint.interval_s=1",
            "stop.max_seconds=90", "eval.target_return=null", "log.progress=false", "log.tensorboard=false",
            "log.interval_s=0.25"])
        ended = time.time()
    finally:
        done.set()
        thread.join(timeout=5)
        if "pid" in stopped and descends_from_us(stopped["pid"]):
            try:
                os.kill(stopped["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass  # the run ended it
    assert stopped, summary
    assert summary["stop_reason"] == "role_failure", summary
    assert summary["failure"] == (f"stopped: the replay stopped answering: no reply within {HANG_TIMEOUT_S} s "
                                  "(fault.role_timeout_s)"), summary
    assert HANG_TIMEOUT_S - 2 < ended - stopped["at"] < HANG_TIMEOUT_S + 7, (ended - stopped["at"], summary)
    assert json.load(open(os.path.join(run_dir, "summary.json")))["failure"] == summary["failure"]
    assert not os.path.exists(os.path.join(run_dir, "failure.log"))  # a fault the runtime expects, not a bug
    assert newest_checkpoint_updates(run_dir) is not None  # the run is resumable
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Unhandled error" not in err, err


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
