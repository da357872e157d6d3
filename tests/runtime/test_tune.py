"""`distrl tune`: sweeps of PPO CartPole (single-mode trials) on Ray Tune: a grid with ASHA stopping its bad
trials early and tabling every trial, a killed sweep resumed without running its finished trials again, bad input."""
from __future__ import annotations

import csv
import glob
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from distrl.api import resume, train
from distrl.checks import validate
from distrl.cli import main
from distrl.runtime.tune import parse_axis, resume_sweep, run_sweep, split_values
from tests.runtime.processes import kill_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "ppo_cartpole.yaml")
# Rows and evaluations at fixed env steps: a trial's curve is the same in every run.
FAST = ["log.interval_steps=512", "eval.interval_steps=512", "eval.episodes=3", "eval.target_return=null",
        "log.tensorboard=false"]
API = {"train": train, "resume": resume, "validate": validate}


def _summary(sweep_dir: str, row: dict) -> dict:
    with open(os.path.join(sweep_dir, row["run_dir"], "summary.json")) as fh:
        return json.load(fh)


def _trial(sweep_dir: str, row: dict) -> dict:
    with open(os.path.join(sweep_dir, row["run_dir"], "trial.json")) as fh:
        return json.load(fh)


def test_a_trial_asks_tune_for_its_roles_bundles_on_a_cluster_and_one_cpu_in_single_mode():
    from distrl.config import ConfigError, load_config
    from distrl.runtime.ray_setup import roster
    from distrl.runtime.tune import trial_resources

    cfg = load_config(CONFIG, ["mode=sync", "workers=2", "device=cpu", "placement.replay={slot: 1}"])
    bundles = trial_resources("sync", roster(cfg, clustered=True), "head:6379", 8).bundles
    # the trial's driver, then one bundle per actor that asks for something: learner, replay, two workers
    assert bundles == [{"CPU": 1.0}, {"CPU": 1.0}, {"slot": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}]
    with pytest.raises(ConfigError, match=r"^config key 'workers': a sync trial with 2 workers needs 4 CPUs; "
                                          r"the cluster at head:6379 has 3$"):
        trial_resources("sync", roster(cfg, clustered=True), "head:6379", 3)
    embedded = trial_resources("sync", roster(cfg, clustered=False), None, 2).bundles
    assert embedded == [{"CPU": 2.0}]  # capped at the machine's CPUs: only paces the trials
    assert trial_resources("single", roster(cfg, clustered=False), None, 2).bundles == [{"CPU": 1.0}]


def test_a_resumed_trial_waits_for_a_killed_sweeps_process_to_leave_its_run_dir(tmp_path):
    """A process still holding the run dir's lock is waited for; past the limit, RunDirBusy names it."""
    import threading

    from distrl.checkpoint.lock import RunDirBusy
    from distrl.runtime.tune_trial import wait_for_writer

    holder = subprocess.Popen([sys.executable, "-c", "import sys; from distrl.checkpoint.lock import RunDirLock; "
                               "RunDirLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read()",
                               str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RunDirBusy, match=f"in use by another distrl process \\(pid {holder.pid}\\)"):
        wait_for_writer(str(tmp_path), timeout_s=0.3)
    released = []
    threading.Timer(0.5, lambda: (released.append(time.monotonic()), holder.stdin.close())).start()
    wait_for_writer(str(tmp_path), timeout_s=60)
    assert released and time.monotonic() > released[0]  # it returned only once the holder let go
    assert holder.wait(timeout=10) == 0
    wait_for_writer(str(tmp_path / "none"), timeout_s=0)  # no run dir yet: nothing to wait for


def test_grid_values_split_on_top_level_commas_only():
    assert split_values("1e-3,3e-4") == ["1e-3", "3e-4"]
    assert split_values("[64, 64],[32]") == ["[64, 64]", "[32]"]
    assert parse_axis("ppo.lr=1e-3,3e-4") == ("ppo.lr", {"values": [0.001, 0.0003]})
    assert parse_axis("model.hidden=[64, 64],[32]") == ("model.hidden", {"values": [[64, 64], [32]]})
    assert parse_axis("ppo.lr=loguniform(1e-4,1e-2)") == ("ppo.lr", {"dist": "loguniform", "args": [0.0001, 0.01]})


@pytest.mark.parametrize("args, says", [
    (["--grid", "ppo.lrr=1e-3,3e-4"], "unknown config key 'ppo.lrr'"),
    (["--grid", "ppo.lr=1e-3,-1"], "config key 'ppo.lr': must be > 0.0"),
    (["--grid", "ppo.lr"], "--grid 'ppo.lr': expected section.key=value1,value2"),
    (["--grid", "ppo.lr=loguniform(0,1)"], "loguniform needs low > 0"),
    (["--grid", "seed=0,1", "--grid", "seed=2"], "a key is given twice"),
    ([], "nothing to sweep"),
])
def test_a_bad_sweep_is_one_line_and_writes_nothing(tmp_path, capsys, args, says):
    sweep_dir = tmp_path / "sweep"
    assert main(["tune", CONFIG, "--dir", str(sweep_dir), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not sweep_dir.exists()


def test_resume_of_a_dir_that_holds_no_sweep_is_one_line(tmp_path, capsys):
    assert main(["tune", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not a distrl sweep dir" in err and err.count("\n") == 1


def test_an_asha_grid_sweep_tables_every_trial_and_stops_those_that_learn_nothing_early(tmp_path, ray_session):
    """One sweep of four learning rates: first two that learn, then two too small to move the policy. Those
    start only once one of the first has ended (two at once), so ASHA compares them at 256 env steps with a trial that learned (best eval
    return >= 40 there, theirs <= 12) and stops them: their runs end cleanly, as at any stop condition. The
    budget is far beyond that rung (a stop request reaches a run within a few rows)."""
    sweep_dir = str(tmp_path / "asha")
    rows_at = ["log.interval_steps=256", "eval.interval_steps=256", "stop.max_env_steps=4096"]
    out = run_sweep(CONFIG, ["ppo.lr=3e-3,1e-3,1e-9,1e-10"], overrides=FAST + rows_at, sweep_dir=sweep_dir,
                    max_concurrent=2, scheduler="asha", grace_period=256, **API)
    rows = out["trials"]
    assert out["dir"] == sweep_dir and len(rows) == 4
    assert sorted(r["ppo.lr"] for r in rows) == [1e-10, 1e-9, 0.001, 0.003]
    values = [r["best_eval_return"] for r in rows]
    assert values == sorted(values, reverse=True)  # best first
    assert {r["ppo.lr"] for r in rows[:2]} == {0.003, 0.001}
    # The second learning trial to reach a rung is stopped there when the first did better: one runs on.
    assert "max_env_steps" in {r["stop_reason"] for r in rows[:2]}
    assert [r["stop_reason"] for r in rows[2:]] == ["early_stopped"] * 2
    for row in rows:
        summary = _summary(sweep_dir, row)
        run_dir = os.path.join(sweep_dir, row["run_dir"])
        assert row["stop_reason"] == summary["stop_reason"]
        if row["stop_reason"] == "max_env_steps":
            assert summary["env_steps"] >= 4096
        else:
            assert row["stop_reason"] == "early_stopped" and summary["env_steps"] < 4096
            assert os.path.exists(os.path.join(run_dir, "stop_request.json.done"))  # consumed: a resume goes on
            assert os.path.isdir(os.path.join(run_dir, "checkpoints"))
        assert row["best_eval_return"] == pytest.approx(summary["best_eval_return"])
        assert summary["mode"] == "single"
        with open(os.path.join(run_dir, "config.yaml")) as fh:
            cfg = yaml.safe_load(fh)
        assert cfg["ppo"]["lr"] == row["ppo.lr"]
        assert _trial(sweep_dir, row)["starts"] == 1
    with open(os.path.join(sweep_dir, "trials.csv")) as fh:
        assert [r["trial"] for r in csv.DictReader(fh)] == [r["trial"] for r in rows]
    # `distrl plot SWEEP_DIR`: one group per learning rate.
    from distrl.observe.plot import group_runs, read_sweep

    groups = group_runs(read_sweep(sweep_dir))
    assert sorted(groups) == [(("ppo.lr", lr),) for lr in (1e-10, 1e-9, 0.001, 0.003)]
    assert main(["plot", sweep_dir]) == 0 and os.path.getsize(os.path.join(sweep_dir, "plot.png")) > 10_000


def _wait_for(predicate, timeout_s: float, proc) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert proc.poll() is None, "the sweep ended before it could be killed"
        assert time.time() < deadline, "the sweep did not get there in time"
        time.sleep(0.1)


def _run_dirs(sweep_dir: str) -> dict[int, str]:
    """Trial index -> its run dir, for the trials started so far."""
    root = os.path.join(sweep_dir, "runs")
    names = os.listdir(root) if os.path.isdir(root) else []
    return {int(n.split("_")[1]): os.path.join(root, n) for n in names}


def _stop_between_state_writes(pid: int, tune_dir: str, timeout_s: float = 30.0) -> None:
    """SIGSTOP the sweep's driver (Tune writes its state files there) at a moment both newest ones read whole:
    a stopped process writes nothing, so the kill that follows cuts none."""
    import signal

    from distrl.config import ConfigError
    from distrl.runtime.tune import _check_tune_state

    deadline = time.time() + timeout_s
    while True:
        os.kill(pid, signal.SIGSTOP)
        try:
            _check_tune_state(tune_dir)
            return
        except ConfigError:  # mid-write: let it finish
            assert time.time() < deadline, "Tune's state files never read whole"
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)


def _rows(run_dir: str) -> int:
    path = os.path.join(run_dir, "metrics.csv")
    return max(0, len(open(path).readlines()) - 1) if os.path.exists(path) else 0


def test_a_killed_sweep_resumes_without_running_finished_trials_again(tmp_path, ray_session, capsys):
    sweep_dir = str(tmp_path / "killed")
    cmd = [sys.executable, "-m", "distrl.cli", "tune", CONFIG, "--grid", "seed=0,1", "--dir", sweep_dir,
           "--max-concurrent", "1", *[a for o in FAST + ["stop.max_env_steps=1024"] for a in ("--set", o)]]
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # Killed once the second trial has logged a row (half its steps): the first finished before Tune
        # started it. Tune rewrites its state files as it goes; a kill while it copies one into place is the
        # test's last part, so here the driver is killed between two writes.
        _wait_for(lambda: 1 in _run_dirs(sweep_dir) and _rows(_run_dirs(sweep_dir)[1]) > 0, 240, proc)
        _stop_between_state_writes(proc.pid, os.path.join(sweep_dir, "tune"))
    finally:
        kill_session(proc.pid)  # the driver and every process it and its Ray started
        proc.wait()
    dirs = _run_dirs(sweep_dir)
    assert not os.path.exists(os.path.join(dirs[1], "summary.json"))
    finished = {i: os.stat(os.path.join(dirs[i], "summary.json")).st_mtime_ns for i in (0,)}

    out = resume_sweep(sweep_dir, train=train, resume=resume)
    rows = out["trials"]
    assert len(rows) == 2 and all(r["stop_reason"] == "max_env_steps" for r in rows)
    assert sorted(_trial(sweep_dir, r)["starts"] for r in rows) == [1, 2]  # only the killed one again
    for i, mtime in finished.items():
        assert os.stat(os.path.join(dirs[i], "summary.json")).st_mtime_ns == mtime
    assert _summary(sweep_dir, {"run_dir": dirs[1]})["env_steps"] >= 1024

    # Tune's newest state file cut short (a kill while Tune copied it into place): Tune would start the
    # whole sweep over; the resume refuses in one line instead, and runs nothing.
    state = sorted(glob.glob(os.path.join(sweep_dir, "tune", "basic-variant-state-*.json")))[-1]
    with open(state, "r+b") as fh:
        fh.truncate(os.path.getsize(state) // 2)
    capsys.readouterr()
    assert main(["tune", "--resume", sweep_dir]) == 2
    err = capsys.readouterr().err
    assert f"{state} is cut short" in err and err.count("\n") == 1, err
    assert sorted(_trial(sweep_dir, r)["starts"] for r in rows) == [1, 2]


def test_placement_groups_left_by_a_dead_actor_are_released_and_no_others(ray_session):
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    from distrl.runtime.tune_trial import release_orphan_groups

    @ray.remote(num_cpus=0)
    class Maker:  # a trial's run reserving a group of its own
        def make(self):
            group = placement_group([{"CPU": 0.5}])
            ray.get(group.ready())
            return group.id.hex()

    own = placement_group([{"CPU": 0.5}])  # a driver's (as Tune's trial groups are): never touched
    ray.get(own.ready())
    maker = Maker.remote()
    left = ray.get(maker.make.remote())
    try:
        assert release_orphan_groups() == 0  # its creator is alive
        ray.kill(maker)
        deadline = time.time() + 30
        while not release_orphan_groups() and time.time() < deadline:
            time.sleep(0.2)
        assert placement_group_table()[left]["state"] == "REMOVED"
        assert placement_group_table()[own.id.hex()]["state"] == "CREATED"
    finally:
        remove_placement_group(own)
