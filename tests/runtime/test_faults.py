"""Fault tolerance through real processes: SIGKILLed workers, envs that raise, a replay server and an
evaluator killed, an evaluator that hangs."""
import csv
import json
import os
import signal
import threading
import time

from distrl import train
from tests.runtime.processes import descends_from_us, pids_of, started_at

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")


def kill_workers(times: int, run_dir: str, log: list) -> None:
    """SIGKILL a RolloutWorker `times` times, each one that has been up for a few seconds, a second apart:
    the run may solve within seconds of its first kill, so a later kill does not wait for a restart."""
    metrics = os.path.join(run_dir, "metrics.csv")
    first_seen: dict[int, float] = {}
    deadline, last_kill = time.time() + 120, 0.0
    while len(log) < times and time.time() < deadline:
        now = time.time()
        pids = pids_of("RolloutWorker")  # one listing: a worker restarted between two listings has no first_seen
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


def newest_done_meta(run_dir: str) -> dict:
    return json.load(open(os.path.join(run_dir, "checkpoints", newest_done_checkpoint(run_dir), "meta.json")))


def best_return(run_dir: str) -> float | None:
    try:
        return json.load(open(os.path.join(run_dir, "checkpoints", "best.json")))["return_mean"]
    except (OSError, ValueError):
        return None  # none yet (best.json is written whole, by a rename)


HANG_TIMEOUT_S = 15  # fault.role_timeout_s of the runs below: above a role's start-up on a loaded machine (every role imports torch)


def test_replay_server_and_evaluator_deaths_are_survived_and_a_hung_evaluator_ends_the_run(ray_session, tmp_path):
    """Sync mode, where the driver waits on the replay server's adds: the server is stopped (so a call is
    surely in flight) and then killed; it comes back refilled from the newest checkpoint. Then the
    evaluator is killed, and once its new process has been up a few seconds it is stopped (SIGSTOP: alive,
    answering nothing) for good. Training goes on while it hangs; after fault.role_timeout_s the run ends
    naming it, with a final checkpoint. best.json, read all along, never goes down, although the restarted
    evaluator starts from no best of its own."""
    run_dir, done = str(tmp_path / "run"), threading.Event()
    killed, bests = {}, []  # bests: (time, best.json's return) whenever it changes
    # Actors of an earlier test may still be exiting: only processes that were not there are this run's.
    before = {(pid, started_at(pid)) for name in ("ReplayServer", "Evaluator") for pid in pids_of(name)}

    def ours(name: str) -> list[int]:
        return [pid for pid in pids_of(name) if (pid, started_at(pid)) not in before]

    def rows() -> int:
        path = os.path.join(run_dir, "metrics.csv")
        return len(open(path).readlines()) if os.path.exists(path) else 0

    def watch_best():
        while not done.is_set():
            now = best_return(run_dir)
            if now is not None and (not bests or bests[-1][1] != now):
                bests.append((time.time(), now))
            time.sleep(0.02)

    def killer():
        deadline = time.time() + 90
        while time.time() < deadline and newest_done_checkpoint(run_dir) is None and not done.is_set():
            time.sleep(0.2)
        if done.is_set():  # the run ended early: its failure shows in the assertions
            return
        pid = ours("ReplayServer")[0]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.5)
        os.kill(pid, signal.SIGKILL)
        killed["ReplayServer"] = pid
        time.sleep(2.0)
        pid = ours("Evaluator")[0]
        os.kill(pid, signal.SIGKILL)
        killed["Evaluator"] = (pid, time.time())
        after, since = rows(), {}
        while time.time() < deadline and not done.is_set():
            for new in ours("Evaluator"):  # its restart is counted once the driver has seen the new pid
                since.setdefault(new, time.time())
            up = [p for p, t in since.items() if p != pid and time.time() - t > 3.0]
            if up and rows() >= after + 8:
                os.kill(up[0], signal.SIGSTOP)
                killed["hung Evaluator"] = (up[0], time.time())
                return
            time.sleep(0.2)

    threads = [threading.Thread(target=f, daemon=True) for f in (killer, watch_best)]
    for thread in threads:
        thread.start()
    start = time.time()
    try:
        summary = train(CARTPOLE, run_dir=run_dir, overrides=[
            "mode=sync", "workers=2", "stop.max_seconds=90", "eval.target_return=null", "checkpoint.interval_s=2",
            f"fault.role_timeout_s={HANG_TIMEOUT_S}", "eval.interval_s=0.3", "log.interval_s=0.25",
            "log.progress=false", "log.tensorboard=false"])
        ended = time.time()
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=5)
        pid = killed.get("hung Evaluator", (None,))[0]
        if pid is not None and descends_from_us(pid):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # the run ended it
    assert set(killed) == {"ReplayServer", "Evaluator", "hung Evaluator"}, (killed, summary)
    assert summary["replay_restarts"] >= 1 and summary["replay_refilled_items"] > 0, summary
    assert summary["evaluator_restarts"] >= 1, summary
    assert summary["updates"] > 0
    # The hang, and nothing before it, ended the run: once, after the timeout, naming the evaluator.
    hung_at = killed["hung Evaluator"][1]
    assert summary["stop_reason"] == "role_failure", summary
    assert summary["failure"] == (f"stopped: the evaluator stopped answering: no reply within {HANG_TIMEOUT_S} s "
                                  "(fault.role_timeout_s)"), summary
    assert HANG_TIMEOUT_S - 2 < ended - hung_at < HANG_TIMEOUT_S + 7, (ended - hung_at, summary)
    metrics = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    went_on = [int(r["updates"]) for r in metrics if float(r["wall_s"]) > hung_at - start + 1.0]
    assert went_on and went_on[-1] > went_on[0], summary  # training went on while the evaluator hung
    meta = newest_done_meta(run_dir)  # the final checkpoint: it needs no evaluator
    assert (meta["counters"]["env_steps"], meta["counters"]["updates"]) == (summary["env_steps"], summary["updates"])
    # The best only improved, across the evaluator's restart.
    values = [v for _, v in bests]
    assert values == sorted(values), bests
    assert values[-1] == summary["best_eval_return"] == max(float(r["best_eval_return"] or "-inf") for r in metrics)
