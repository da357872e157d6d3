"""One writer per run dir, resumes that repair what a dead run left, and interrupts that end a run."""
import csv
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from distrl import resume
from distrl.cli import main
from tests.runtime.processes import PACED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
QUIET = ["log.progress=false", "log.tensorboard=false", "eval.target_return=null"]


def start_training(run_dir, *extra):
    return subprocess.Popen([sys.executable, "-m", "distrl.cli", "train", CARTPOLE, "--mode", "single",
                             "--run-dir", run_dir, "--max-seconds", "120", *sum((["--set", q] for q in QUIET), []),
                             *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for(cond, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline and not cond():
        time.sleep(0.1)
    assert cond()


def checkpoints(run_dir):
    return sorted(p for p in glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*")) if os.path.exists(p + "/DONE"))


def test_a_live_run_dir_is_refused_to_a_second_train_and_to_resume(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    live = start_training(run_dir, "--set", "checkpoint.interval_s=1")
    try:
        wait_for(lambda: checkpoints(run_dir))
        assert main(["train", CARTPOLE, "--mode", "single", "--run-dir", run_dir]) == 2
        assert "already holds a run" in capsys.readouterr().err
        assert main(["resume", run_dir]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is in use by another distrl process (pid {live.pid})" in err[0]
    finally:
        live.kill()
        live.wait()


def test_a_second_train_on_a_live_run_dir_is_refused_by_the_lock_itself(tmp_path, capsys):
    """The dir holds nothing but the live owner's lock (no config.yaml yet: the owner's roles are starting)."""
    from distrl.checkpoint.lock import RunDirLock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    owner = RunDirLock(str(run_dir)).acquire()  # another open file: flock refuses it even in this process
    try:
        assert main(["train", CARTPOLE, "--mode", "single", "--run-dir", str(run_dir)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is in use by another distrl process (pid {os.getpid()})" in err[0], err
        assert os.listdir(run_dir) == [".lock"]
    finally:
        owner.release()


def test_a_train_refused_by_the_lock_keeps_a_run_dir_it_made_for_the_run_that_holds_it(tmp_path, capsys, monkeypatch):
    """Two trains race for a new dir: this one made it, the other took the lock first. The dir is the
    other's live run now: the refused one must not remove it."""
    from distrl.checkpoint.lock import RunDirLock
    from distrl.runtime import launch

    rival: list = []

    class LosingLock(RunDirLock):
        def acquire(self):
            rival.append(RunDirLock(os.path.dirname(self.path)).acquire())  # the other train wins the race
            return super().acquire()

    monkeypatch.setattr(launch, "RunDirLock", LosingLock)
    run_dir = tmp_path / "new" / "run"
    try:
        assert main(["train", CARTPOLE, "--mode", "single", "--run-dir", str(run_dir)]) == 2
        assert "is in use by another distrl process" in capsys.readouterr().err
        assert os.listdir(run_dir) == [".lock"]
    finally:
        rival[0].release()


def test_a_start_up_failure_removes_the_dirs_this_train_made_and_nothing_else(tmp_path, capsys, monkeypatch):
    from distrl.core import RoleLost
    from distrl.runtime import launch

    def no_roles(*args, **kwargs):
        raise RoleLost("no node had room for the learner")

    monkeypatch.setattr(launch, "make_roles", no_roles)
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "other").write_text("x")
    assert main(["train", CARTPOLE, "--mode", "single", "--run-dir", str(tmp_path / "kept" / "a" / "b" / "run")]) == 1
    assert "could not start: no node had room" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["kept"] and os.listdir(tmp_path / "kept") == ["other"]


def test_running_out_of_memory_while_starting_names_the_replay_capacity(tmp_path, capsys, monkeypatch):
    from distrl.runtime import launch

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(launch, "make_roles", no_memory)
    run_dir = tmp_path / "run"
    assert main(["train", CARTPOLE, "--mode", "single", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config key 'replay.capacity': this machine ran out of memory" in err[0], err
    assert not run_dir.exists()


def test_the_run_dir_is_absolute_wherever_it_was_given_from(tmp_path, monkeypatch):
    from distrl import train

    monkeypatch.chdir(tmp_path)
    summary = train(CARTPOLE, run_dir="rel/run", overrides=["mode=single", "stop.max_env_steps=256", *QUIET])
    assert summary["run_dir"] == str(tmp_path / "rel" / "run")


def test_the_worker_limit_counts_the_cpus_this_process_may_use(monkeypatch):
    from distrl import checks
    from distrl.threads import usable_cpus

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cpus() == 1
    assert checks.host_worker_limit() <= checks.WORKERS_PER_CORE


def test_default_run_dirs_of_runs_started_together_differ():
    from distrl.api import default_run_dir
    from distrl.config import load_config

    cfg = load_config(CARTPOLE, ["seed=3"])
    names = {default_run_dir(cfg.algo, cfg.env.id, cfg.mode, cfg.seed) for _ in range(50)}
    assert len(names) == 50 and all("seed3" in n for n in names)


def test_a_second_interrupt_ends_the_run_at_once_and_one_sigterm_ends_it_cleanly(tmp_path):
    """The second SIGINT 50 ms after the first lands while the run waits; 100 ms after, while it writes
    its last checkpoint. Either way summary.json is written. In sync mode too, where the driver waits on
    its Ray actors. The four runs go at once (their start-up is most of their time), each signalled from a
    thread of its own as soon as it is going, on an env paced by the clock: a run waiting for its signal
    leaves the cores to the others' start-up."""
    cases = {"twice": ([signal.SIGINT, signal.SIGINT], 0.05, "single"),
             "twice-later": ([signal.SIGINT, signal.SIGINT], 0.1, "single"),
             "term": ([signal.SIGTERM], 0, "single"),
             "sync-twice": ([signal.SIGINT, signal.SIGINT], 0.05, "sync")}
    paced = [a for q in PACED for a in ("--set", q)]
    procs = {name: start_training(str(tmp_path / name), "--mode", mode, *paced)
             for name, (_, _, mode) in cases.items()}
    outcomes: dict = {}

    def interrupt(name: str) -> None:
        signals, gap_s, _ = cases[name]
        run_dir, proc = str(tmp_path / name), procs[name]
        try:
            wait_for(lambda: os.path.exists(os.path.join(run_dir, "metrics.csv")), timeout=120)
            time.sleep(1.0)
            t0 = time.time()
            for sig in signals:
                proc.send_signal(sig)
                time.sleep(gap_s)
            code = proc.wait(timeout=30)
            outcomes[name] = (code, time.time() - t0, proc.stderr.read())
        except BaseException as e:  # noqa: BLE001 - reported below, by case
            outcomes[name] = e

    threads = [threading.Thread(target=interrupt, args=(name,)) for name in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in cases:
        if procs[name].poll() is None:
            procs[name].kill()
        assert not isinstance(outcomes[name], BaseException), (name, outcomes[name])
        code, took_s, stderr = outcomes[name]
        assert code == 130 and took_s < 20, (name, code, took_s, stderr[-2000:])
        summary = json.load(open(os.path.join(str(tmp_path / name), "summary.json")))
        assert summary["stop_reason"] == "interrupted", name
        assert "Traceback" not in stderr, name


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A single-mode run SIGKILLed after two checkpoints: its logs run past the newest one."""
    run_dir = str(tmp_path_factory.mktemp("killed") / "run")
    proc = start_training(run_dir, "--set", "checkpoint.interval_s=1", "--set", "log.interval_s=0.2")
    wait_for(lambda: len(checkpoints(run_dir)) >= 2)
    time.sleep(0.7)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return run_dir


def copy_run(src, dst):
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def test_resume_cuts_the_logs_back_to_the_checkpoint_and_drops_a_half_line(killed_run, tmp_path):
    run_dir = copy_run(killed_run, str(tmp_path / "run"))
    with open(os.path.join(run_dir, "metrics.csv"), "a") as fh:
        fh.write("99999.0,12")  # a line the dying process never finished
    meta = json.load(open(checkpoints(run_dir)[-1] + "/meta.json"))
    steps = meta["counters"]["env_steps"]
    summary = resume(run_dir, overrides=[f"stop.max_env_steps={steps + 2000}"])
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    env_steps = [int(r["env_steps"]) for r in rows]
    assert env_steps == sorted(env_steps) and env_steps[-1] == summary["env_steps"]  # no step repeats
    assert all(len(r) == len(rows[0]) and None not in r.values() for r in rows)
    learner = [json.loads(line) for line in open(os.path.join(run_dir, "learner.jsonl"))]
    assert [r["env_steps"] for r in learner] == sorted(r["env_steps"] for r in learner)
    log = json.loads(open(os.path.join(run_dir, "resumes.jsonl")).read().splitlines()[-1])
    assert log["rows_cut"]["metrics.csv"] >= 1


def test_resume_falls_back_from_a_tampered_newest_checkpoint(killed_run, tmp_path, capsys):
    run_dir = copy_run(killed_run, str(tmp_path / "run"))
    older, newest = checkpoints(run_dir)[-2:]
    with open(os.path.join(newest, "learner.pt"), "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00tampered")
    steps = json.load(open(older + "/meta.json"))["counters"]["env_steps"]
    resume(run_dir, overrides=[f"stop.max_env_steps={steps + 1000}"])
    assert f"falling back to {older}" in capsys.readouterr().err
    log = json.loads(open(os.path.join(run_dir, "resumes.jsonl")).read().splitlines()[-1])
    assert log["checkpoint"] == older and log["env_steps"] == steps


@pytest.mark.parametrize("override, key", [("replay.capacity=5000", "replay.capacity"),
                                           ("model.hidden=[32, 32]", "model.hidden")])
def test_an_override_the_checkpoint_cannot_take_is_one_line_exit_2(killed_run, tmp_path, capsys, override, key):
    run_dir = copy_run(killed_run, str(tmp_path / "run"))
    before = open(os.path.join(run_dir, "metrics.csv")).read()
    assert main(["resume", run_dir, "--set", override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"config key '{key}' cannot change on resume" in err[0]
    assert open(os.path.join(run_dir, "metrics.csv")).read() == before  # nothing was touched


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_an_empty_config_file_is_one_line_and_exit_2_and_writes_nothing(tmp_path, capsys, text):
    config, run_dir = tmp_path / "empty.yaml", tmp_path / "run"
    config.write_text(text)
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"config file {config} is empty" in err[0], err
    assert not run_dir.exists()
