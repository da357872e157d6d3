"""Fault tolerance through real processes: SIGKILLed workers (one right before the run ends), envs that
raise, a replay server and an evaluator killed, an evaluator that hangs, single mode's evaluator killed.
Every restart is counted exactly."""
import csv
import json
import os
import signal
import threading
import time

from distrl import train
from distrl.config import FaultConfig
from tests.runtime.processes import (PACED, ended_at, fault_events, new_pids, resume_if_stopped, snapshot,
                                     started_at, stop_as_ctrl_c)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")


def kill_workers(times: int, run_dir: str, log: list, before: set) -> None:
    """SIGKILL a RolloutWorker of this run `times` times, each one that has been up for a few seconds, a
    second apart: the run may solve within seconds of its first kill, so a later kill does not wait for a
    restart."""
    metrics = os.path.join(run_dir, "metrics.csv")
    first_seen: dict[int, float] = {}
    deadline, last_kill = time.time() + 120, 0.0
    while len(log) < times and time.time() < deadline:
        now = time.time()
        pids = new_pids("RolloutWorker", before)  # one listing: a worker restarted between two has no first_seen
        for pid in pids:
            first_seen.setdefault(pid, now)
        settled = [p for p in pids if now - first_seen[p] >= 4.0 and p not in log]
        if os.path.exists(metrics) and settled and now - last_kill >= 1.0:
            os.kill(settled[-1], signal.SIGKILL)
            log.append(settled[-1])
            last_kill = now
        time.sleep(0.2)


def test_learning_survives_env_exceptions_and_a_worker_killed_twice(ray_session, tmp_path):
    """Ape-X DQN's learning test, with both faults in its async run: each is counted, and it still reaches
    the greedy target within the step budget."""
    run_dir = str(tmp_path / "run")
    killed: list = []
    killer = threading.Thread(target=kill_workers, args=(2, run_dir, killed, snapshot("RolloutWorker")), daemon=True)
    killer.start()
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[
        "mode=async", "workers=2", "seed=0", "env.id=distrl.envs.testing:FlakyCartPole-v1",
        "env.kwargs={error_prob: 0.001}", "stop.max_env_steps=400000", "stop.max_seconds=300",
        "log.progress=false", "log.tensorboard=false", "log.interval_s=0.5"])
    killer.join(timeout=5)
    assert len(killed) == 2
    assert summary["worker_restarts"] == 2, summary  # each death counted once, whenever the driver looks
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


def newest_done_meta(run_dir: str) -> dict:
    return json.load(open(os.path.join(run_dir, "checkpoints", newest_done_checkpoint(run_dir), "meta.json")))


def best_return(run_dir: str) -> float | None:
    try:
        return json.load(open(os.path.join(run_dir, "checkpoints", "best.json")))["return_mean"]
    except (OSError, ValueError):
        return None  # none yet (best.json is written whole, by a rename)


HANG_TIMEOUT_S = FaultConfig().role_timeout_s  # the default: a started role answers its heartbeat in ms


def rows(run_dir: str) -> int:
    path = os.path.join(run_dir, "metrics.csv")
    return len(open(path).readlines()) if os.path.exists(path) else 0


def evaluations_since(run_dir: str, wall_s: float) -> int:
    """Distinct evaluation results metrics.csv shows after `wall_s` seconds into the run."""
    path = os.path.join(run_dir, "metrics.csv")
    with open(path) as fh:
        return len({(r["eval_return_mean"], r["eval_return_std"]) for r in csv.DictReader(fh)
                    if r["wall_s"] and float(r["wall_s"]) > wall_s and r["eval_return_mean"]})


def test_replay_server_and_evaluator_deaths_and_a_hung_evaluator_are_survived_and_counted(ray_session, tmp_path):
    """Sync mode, where the driver waits on the replay server's adds: the server is stopped (so a call is
    surely in flight) and then killed; it comes back refilled from the newest checkpoint. Then the
    evaluator is killed, and once its new process has been up a few seconds it is stopped (SIGSTOP: alive,
    answering nothing) for good: within fault.role_timeout_s it is ended and restarted, and evaluations go
    on (the run is then stopped as a Ctrl-C would, once new results have arrived). Training goes on all along.
    best.json, read all along, never goes down, although each restarted evaluator starts from no best of
    its own."""
    run_dir, done = str(tmp_path / "run"), threading.Event()
    killed, bests = {}, []  # bests: (time, best.json's return) whenever it changes
    before = {name: snapshot(name) for name in ("ReplayServer", "Evaluator")}

    def watch_best():
        while not done.is_set():
            now = best_return(run_dir)
            if now is not None and (not bests or bests[-1][1] != now):
                bests.append((time.time(), now))
            time.sleep(0.02)

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline and newest_done_checkpoint(run_dir) is None and not done.is_set():
            time.sleep(0.2)
        if done.is_set():  # the run ended early: its failure shows in the assertions
            return
        pid = new_pids("ReplayServer", before["ReplayServer"])[0]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.5)
        os.kill(pid, signal.SIGKILL)
        killed["ReplayServer"] = pid
        time.sleep(2.0)
        pid = new_pids("Evaluator", before["Evaluator"])[0]
        os.kill(pid, signal.SIGKILL)
        killed["Evaluator"] = (pid, time.time())
        after, since = rows(run_dir), {}
        while time.time() < deadline and not done.is_set():
            for new in new_pids("Evaluator", before["Evaluator"]):
                since.setdefault(new, time.time())
            up = [p for p, t in since.items() if p != pid and time.time() - t > 3.0]
            if up and rows(run_dir) >= after + 8:
                killed["hung Evaluator"] = (up[0], time.time(), started_at(up[0]))
                os.kill(up[0], signal.SIGSTOP)
                break
            time.sleep(0.2)
        while time.time() < deadline and not done.is_set():  # back, and a few results from it: stop
            back = [at for at, text in fault_events(run_dir) if text.startswith("evaluator hung")]
            if back and len(bests) and rows(run_dir) > 0 and evaluations_since(run_dir, back[0]) >= 3:
                stop_as_ctrl_c()
                return
            time.sleep(0.2)

    threads = [threading.Thread(target=f, daemon=True) for f in (killer, watch_best)]
    for thread in threads:
        thread.start()
    start = time.time()
    try:
        summary = train(CARTPOLE, run_dir=run_dir, start_time=start, overrides=[
            "mode=sync", "workers=2", "stop.max_seconds=240", "eval.target_return=null", "checkpoint.interval_s=2",
            "eval.interval_s=0.3", "log.interval_s=0.25",
            "log.progress=false", "log.tensorboard=false", *PACED])
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=5)
        if "hung Evaluator" in killed:
            resume_if_stopped(killed["hung Evaluator"][0], killed["hung Evaluator"][2])
    assert set(killed) == {"ReplayServer", "Evaluator", "hung Evaluator"}, (killed, summary)
    assert summary["stop_reason"] == "interrupted" and summary["failure"] is None, summary
    assert summary["replay_restarts"] == 1 and summary["replay_refilled_items"] > 0, summary
    assert summary["evaluator_restarts"] == 2, summary  # the kill and the hang
    assert summary["updates"] > 0
    # The hang was ended within fault.role_timeout_s (plus the heartbeat's one-second period), and
    # evaluations went on after it.
    hung_at = killed["hung Evaluator"][1] - start
    hung = [e for e in fault_events(run_dir) if e[1].startswith("evaluator hung")]
    assert len(hung) == 1 and HANG_TIMEOUT_S - 1 < ended_at(hung[0]) - hung_at < HANG_TIMEOUT_S + 5, (hung, hung_at)
    metrics = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    went_on = [int(r["updates"]) for r in metrics if hung_at + 1.0 < float(r["wall_s"]) < hung[0][0]]
    assert went_on and went_on[-1] > went_on[0], summary  # training went on while the evaluator hung
    meta = newest_done_meta(run_dir)  # the final checkpoint
    assert (meta["counters"]["env_steps"], meta["counters"]["updates"]) == (summary["env_steps"], summary["updates"])
    # The best only improved, across both restarts.
    values = [v for _, v in bests]
    assert values == sorted(values), bests
    assert values[-1] == summary["best_eval_return"] == max(float(r["best_eval_return"] or "-inf") for r in metrics)


def test_a_worker_killed_right_before_the_run_ends_is_counted(ray_session, tmp_path):
    """The run ends (as when it solves, here by an interrupt) the moment after a worker is killed: no
    gather sees the worker's new process, and its restart is counted all the same (Ray reports the death)."""
    run_dir, before, killed = str(tmp_path / "run"), snapshot("RolloutWorker"), []

    def kill_then_stop():
        deadline = time.time() + 120
        while time.time() < deadline and rows(run_dir) < 4:
            time.sleep(0.1)
        pids = new_pids("RolloutWorker", before)
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])
        stop_as_ctrl_c()

    thread = threading.Thread(target=kill_then_stop, daemon=True)
    thread.start()
    summary = train(CARTPOLE, run_dir=str(run_dir), overrides=[
        "mode=async", "workers=2", "stop.max_seconds=120", "eval.target_return=null", "log.interval_s=0.25",
        "log.progress=false", "log.tensorboard=false", *PACED])
    thread.join(timeout=5)
    assert killed, summary
    assert summary["stop_reason"] == "interrupted", summary
    assert summary["worker_restarts"] == 1, summary


def test_single_modes_evaluator_killed_is_restarted_and_the_run_still_solves(tmp_path, capfd):
    """Single mode's evaluator is a process of its own: SIGKILLed after its first result, it is found dead,
    restarted and counted, and the restarted one is the one that finds the run solved."""
    run_dir, before, killed = str(tmp_path / "run"), snapshot("distrl-eval"), []

    def kill_after_first_result():
        deadline = time.time() + 120
        while time.time() < deadline and best_return(run_dir) is None:
            time.sleep(0.05)
        pids = new_pids("distrl-eval", before)
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.append((pids[0], best_return(run_dir)))

    thread = threading.Thread(target=kill_after_first_result, daemon=True)
    thread.start()
    start = time.time()
    summary = train(CARTPOLE, run_dir=run_dir, start_time=start, overrides=[
        "mode=single", "stop.max_seconds=150", "log.progress=false",
        "log.tensorboard=false"])
    thread.join(timeout=5)
    assert killed and killed[0][1] < 475, (killed, summary)  # killed before the run could solve
    assert summary["solved"] and summary["failure"] is None, summary
    assert summary["evaluator_restarts"] == 1, summary
    assert time.time() - start < 150 + 10  # it ended (solved), never blocked on the dead process
    err = capfd.readouterr().err
    assert "distrl: evaluator died (SIGKILL), restarted in " in err, err
    assert "Traceback" not in err, err
