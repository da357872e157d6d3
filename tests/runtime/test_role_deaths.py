"""Every role may die: SIGKILLed learner (inside the first checkpoint interval, and after a checkpoint)
and parameter server during an async Ape-X run; the run finishes solved and counts what happened."""
import csv
import glob
import json
import os
import signal
import threading
import time

from distrl import train
from tests.runtime.processes import pids_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")


def newest_checkpoint_updates(run_dir: str) -> int | None:
    done = sorted(p for p in glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*")) if os.path.exists(p + "/DONE"))
    return json.load(open(done[-1] + "/meta.json"))["counters"]["updates"] if done else None


def killer(run_dir: str, log: list) -> None:
    """Learner once before any checkpoint, learner again after one, then the parameter server."""
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
    at_checkpoint = newest_checkpoint_updates(run_dir)
    os.kill(pids_of("Learner")[0], signal.SIGKILL)
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
