"""Checkpoints and resume through real processes: SIGKILLed driver, bad checkpoints, determinism."""
import csv
import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from bench.procfs import descendants, parent, started_at, stat_fields
from distrl import resume, train
from distrl.checkpoint.run import read_checkpoint
from distrl.replay.store import digest as store_digest
from distrl.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
QUIET = ["log.progress=false", "log.tensorboard=false"]


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def complete_checkpoints(run_dir):
    return sorted(p for p in glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*"))
                  if os.path.exists(os.path.join(p, "DONE")))


def alive(pid: int, started: int | None) -> bool:
    """Whether `pid` is still the process that started at `started`, and not a zombie."""
    fields = stat_fields(pid)  # one read: the process may go between two
    return started is not None and len(fields) > 19 and int(fields[19]) == started and fields[0] != "Z"


def test_sigkill_driver_then_resume_restores_counters_and_replay(tmp_path):
    """Also: the driver's evaluator (a child of its fork server, not of the driver) does not outlive it."""
    run_dir = str(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-m", "distrl.cli", "train", CARTPOLE, "--mode", "single",
                             "--run-dir", run_dir, "--set", "checkpoint.interval_s=1", "--set",
                             "eval.target_return=null", "--set", "stop.max_env_steps=1000000",
                             *sum((["--set", q] for q in QUIET), [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 90
    evaluators = []  # named once forked from the fork server, which imports torch first
    while time.time() < deadline and (len(complete_checkpoints(run_dir)) < 2 or not evaluators):
        evaluators = [pid for pid in descendants(proc.pid) if comm(pid) == "distrl-eval"]
        time.sleep(0.2)
    below = {pid: started_at(pid) for pid in descendants(proc.pid)}
    assert evaluators and all(parent(pid) != proc.pid for pid in evaluators)  # forked by the fork server
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.time() + 15  # the fork server ends with the driver; the evaluator sees its parent go
    while time.time() < deadline and any(alive(pid, t) for pid, t in below.items()):
        time.sleep(0.2)
    assert not [pid for pid, t in below.items() if alive(pid, t)]  # no process of the run lingers
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))  # it really died mid-run
    ckpt = complete_checkpoints(run_dir)[-1]
    meta = json.load(open(os.path.join(ckpt, "meta.json")))
    steps = meta["counters"]["env_steps"]
    summary = resume(run_dir, overrides=[f"stop.max_env_steps={steps + 4000}"])
    log = [json.loads(line) for line in open(os.path.join(run_dir, "resumes.jsonl"))]
    assert log[-1]["checkpoint"] == ckpt
    assert (log[-1]["env_steps"], log[-1]["updates"]) == (steps, meta["counters"]["updates"])
    assert log[-1]["store_sha256"] == meta["store_sha256"] is not None
    assert summary["stop_reason"] == "max_env_steps" and summary["env_steps"] >= steps + 4000
    assert summary["wall_s"] > meta["wall_s"]  # wall time continues from the checkpoint
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    assert int(rows[-1]["env_steps"]) == summary["env_steps"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("done") / "run")
    train(CARTPOLE, run_dir=run_dir, overrides=["mode=single", "stop.max_env_steps=2000",
                                                "eval.target_return=null", *QUIET])
    return run_dir


def _copy_run(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _fix_done(ckpt, name):
    """Re-sign a tampered file in DONE so the checksum passes and the loader's own guard is tested."""
    done_path = os.path.join(ckpt, "DONE")
    done = json.load(open(done_path))
    data = open(os.path.join(ckpt, name), "rb").read()
    done["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    json.dump(done, open(done_path, "w"))


class Planted:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _resume_fails(capsys, run_dir, message):
    metrics = open(os.path.join(run_dir, "metrics.csv")).read()
    code = main(["resume", run_dir])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("distrl: error: ") and message in err[0], err
    assert open(os.path.join(run_dir, "metrics.csv")).read() == metrics  # nothing overwritten
    return err[0]


def test_resume_of_missing_run_dir(capsys, tmp_path):
    assert main(["resume", str(tmp_path / "nope")]) == 2
    assert "run dir not found" in capsys.readouterr().err


def test_resume_with_truncated_checkpoint(capsys, tmp_path, finished_run):
    run_dir = _copy_run(finished_run, str(tmp_path / "run"))
    ckpt = complete_checkpoints(run_dir)[-1]
    path = os.path.join(ckpt, "learner.pt")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    _resume_fails(capsys, run_dir, "checkpoint")


def test_resume_with_planted_pickle(capsys, tmp_path, finished_run):
    run_dir = _copy_run(finished_run, str(tmp_path / "run"))
    ckpt = complete_checkpoints(run_dir)[-1]
    torch.save({"learner": {"state": Planted()}, "torch_rng": torch.get_rng_state()}, os.path.join(ckpt, "learner.pt"))
    _fix_done(ckpt, "learner.pt")
    line = _resume_fails(capsys, run_dir, "learner.pt")
    assert "pwned" not in line


@pytest.mark.parametrize("mode", ["single", "sync"])
def test_deterministic_mode_gives_identical_curves(mode, tmp_path, request):
    if mode == "sync":
        request.getfixturevalue("ray_session")
    cols = ("env_steps", "updates", "eval_return_mean")
    curves = []
    for i in range(2):
        run_dir = str(tmp_path / f"run{i}")
        train(CARTPOLE, run_dir=run_dir, overrides=[
            f"mode={mode}", "workers=2", "seed=7", "stop.max_env_steps=8192", "eval.target_return=null",
            "log.interval_steps=1024", "eval.interval_steps=2048", "eval.episodes=5", *QUIET])
        rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
        curves.append([tuple(r[c] for c in cols) for r in rows])
    assert len(curves[0]) > 5
    assert sum(1 for r in curves[0] if r[2]) >= 3  # several evaluations happened
    assert curves[0] == curves[1]


@pytest.mark.parametrize("mode,limit", [("single", 0), ("sync", 0), ("sync-remote-replay", 10**9)])
def test_replay_size_limit_and_cross_node_store(mode, limit, tmp_path, request, monkeypatch):
    """Over checkpoint.max_replay_bytes the store is left out. Under it (covered for a local replay
    server by the resume tests) a replay server on another node sends its store to the driver
    (a cluster, simulated here)."""
    if mode != "single":
        request.getfixturevalue("ray_session")
    if mode == "sync-remote-replay":
        from distrl.runtime.ray_roles import RayRoles

        monkeypatch.setattr(RayRoles, "replay_on_driver_node", lambda self: False)
        mode = "sync"
    saved = limit > 0
    run_dir = str(tmp_path / "run")
    train(CARTPOLE, run_dir=run_dir, overrides=[
        f"mode={mode}", "workers=1", "stop.max_env_steps=2000", "eval.target_return=null",
        f"checkpoint.max_replay_bytes={limit}", *QUIET])
    ckpt = complete_checkpoints(run_dir)[-1]
    meta = json.load(open(os.path.join(ckpt, "meta.json")))
    assert meta["store_saved"] is saved and (meta["store_sha256"] is not None) is saved
    assert os.path.exists(os.path.join(ckpt, "store.npz")) is saved
    if saved:
        assert store_digest(read_checkpoint(ckpt)["store"]) == meta["store_sha256"]


def test_async_run_resumes_from_the_checkpoint_at_its_stop_past_a_long_final_evaluation(ray_session, tmp_path):
    """An async run through Ray actors whose last evaluation takes most or all of the wind-down (slow episodes, no
    periodic checkpoint): the healthy roles still write the checkpoint at the stop, and the run resumes from it
    (its counters, its replay by hash) and goes on learning, to a checkpoint at its own stop by env steps. (A
    checkpoint that itself outlasts the wind-down, an Atari replay's, is bench/RESULTS.md's "checkpoint at the
    stop".)"""
    run_dir = str(tmp_path / "run")
    first = train(CARTPOLE, run_dir=run_dir, overrides=[
        "mode=async", "workers=1", "env.num_envs=8", "env.id=distrl.envs.testing:WaitingCartPole-v1",
        "env.kwargs={step_s: 0.03}", "eval.episodes=40", "eval.interval_s=600", "checkpoint.interval_s=600",
        "replay.min_size=100", "stop.max_seconds=15", "eval.target_return=null", "seed=0", *QUIET])
    # min_size under one fragment (8 envs x 16 steps): one fragment before the stop gives an update, so the
    # final evaluation runs (a slow start-up can leave time for only one)
    assert first["stop_reason"] == "max_seconds" and first["failure"] is None, first
    assert "checkpoint" not in first["skipped_at_stop"], first
    ckpt = complete_checkpoints(run_dir)[-1]
    meta = json.load(open(os.path.join(ckpt, "meta.json")))
    assert meta["counters"]["env_steps"] == first["env_steps"] and meta["counters"]["updates"] == first["updates"]
    second = resume(run_dir, overrides=[f"stop.max_env_steps={first['env_steps'] + 400}", "stop.max_seconds=300",
                                        "eval.episodes=2"])  # a quick last evaluation
    log = json.loads(open(os.path.join(run_dir, "resumes.jsonl")).read().splitlines()[-1])
    assert (log["checkpoint"], log["env_steps"], log["updates"]) == (ckpt, first["env_steps"], first["updates"])
    assert log["store_sha256"] == meta["store_sha256"] is not None
    assert second["stop_reason"] == "max_env_steps" and second["env_steps"] >= first["env_steps"] + 400, second
    assert second["updates"] > first["updates"], second
    last = json.load(open(os.path.join(complete_checkpoints(run_dir)[-1], "meta.json")))
    assert last["counters"]["env_steps"] == second["env_steps"], last
