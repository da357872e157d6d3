"""Fault tolerance through real processes: SIGKILLed workers, envs that raise."""
import os
import signal
import threading
import time

from distrl import train
from tests.runtime.processes import pids_of, stop_as_ctrl_c

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")


def kill_workers(times: int, run_dir: str, log: list) -> None:
    """SIGKILL a RolloutWorker `times` times, each one that has been up for a few seconds."""
    metrics = os.path.join(run_dir, "metrics.csv")
    first_seen: dict[int, float] = {}
    deadline = time.time() + 120
    while len(log) < times and time.time() < deadline:
        now = time.time()
        pids = pids_of("RolloutWorker")  # one listing: a worker restarted between two listings has no first_seen
        for pid in pids:
            first_seen.setdefault(pid, now)
        settled = [p for p in pids if now - first_seen[p] >= 4.0 and p not in log]
        if os.path.exists(metrics) and len(settled) >= 2:
            os.kill(settled[-1], signal.SIGKILL)
            log.append(settled[-1])
        time.sleep(0.2)


def test_learning_survives_env_exceptions_and_a_worker_killed_twice(ray_session, tmp_path):
    """Ape-X DQN's learning test, with both faults in its async run: each is counted, and it still reaches
    the greedy target within the step budget."""
    run_dir = str(tmp_path / "run")
    killed: list = []
    killer = threading.Thread(target=kill_workers, args=(2, run_dir, killed), daemon=True)
    killer.start()
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[
        "mode=async", "workers=2", "seed=0", "env.id=distrl.envs.testing:FlakyCartPole-v1",
        "env.kwargs={error_prob: 0.001}", "stop.max_env_steps=400000", "stop.max_seconds=300",
        "log.progress=false", "log.tensorboard=false", "log.interval_s=0.5"])
    killer.join(timeout=5)
    assert len(killed) == 2
    assert summary["worker_restarts"] >= 2, summary
    assert summary["fragments_dropped"] >= 1  # a worker killed between calls loses no fragment
    assert summary["env_errors"] > 10, summary
    assert summary["solved"] and summary["best_eval_return"] >= 475, summary
    assert summary["env_steps"] <= 400000


def test_too_many_env_errors_stop_the_run_with_a_clear_reason(tmp_path):
    summary = train(CARTPOLE, run_dir=str(tmp_path / "run"), overrides=[
        "mode=single", "env.id=distrl.envs.testing:FlakyCartPole-v1", "env.kwargs={error_prob: 0.05}",
        "fault.max_env_errors=20", "stop.max_env_steps=50000", "log.progress=false", "log.tensorboard=false"])
    assert summary["stop_reason"] == "env_errors"
    assert "fault.max_env_errors=20" in summary["failure"]
    assert os.path.isfile(os.path.join(str(tmp_path / "run"), "summary.json"))


def newest_done_checkpoint(run_dir: str) -> str | None:
    root = os.path.join(run_dir, "checkpoints")
    done = sorted(d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "DONE"))) \
        if os.path.isdir(root) else []
    return done[-1] if done else None


def test_replay_server_and_evaluator_deaths_are_survived(ray_session, tmp_path):
    """Sync mode, where the driver waits on the replay server's adds: the server is stopped (so a call is
    surely in flight) and then killed; it comes back refilled from the newest checkpoint. Then the
    evaluator is killed. Once the run has logged a few more rows it is stopped as a Ctrl-C would."""
    run_dir = str(tmp_path / "run")
    killed = {}

    def rows() -> int:
        path = os.path.join(run_dir, "metrics.csv")
        return len(open(path).readlines()) if os.path.exists(path) else 0

    def killer():
        deadline = time.time() + 90
        while time.time() < deadline and newest_done_checkpoint(run_dir) is None:
            time.sleep(0.2)
        pid = pids_of("ReplayServer")[0]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.5)
        os.kill(pid, signal.SIGKILL)
        killed["ReplayServer"] = pid
        time.sleep(2.0)
        pid = pids_of("Evaluator")[0]
        os.kill(pid, signal.SIGKILL)
        killed["Evaluator"] = pid
        after = rows()
        while time.time() < deadline and rows() < after + 8:
            time.sleep(0.2)
        stop_as_ctrl_c()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[
        "mode=sync", "workers=2", "stop.max_seconds=90", "eval.target_return=null", "checkpoint.interval_s=2",
        "eval.interval_s=0.3", "log.interval_s=0.25", "log.progress=false", "log.tensorboard=false"])
    thread.join(timeout=5)
    assert set(killed) == {"ReplayServer", "Evaluator"}, (killed, summary)
    assert summary["replay_restarts"] >= 1 and summary["replay_refilled_items"] > 0, summary
    assert summary["evaluator_restarts"] >= 1, summary
    assert summary["stop_reason"] == "interrupted" and summary["failure"] is None, summary
    assert summary["updates"] > 0
