"""Each mode end to end on CartPole-v1 through the real path (Ray actors for sync/async)."""
import csv
import glob
import json
import os

import pytest

from distrl import train
from distrl.observe import METRIC_COLUMNS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
SUMMARY_KEYS = {"algo", "env", "mode", "workers", "seed", "wall_s", "env_steps", "updates", "env_steps_per_s",
                "best_eval_return", "solved", "time_to_solve_s", "stop_reason"}


def short_run(tmp_path, mode, extra=()):
    run_dir = str(tmp_path / mode)
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[
        f"mode={mode}", "workers=2", "stop.max_env_steps=6000", "replay.min_size=1000",
        "eval.interval_s=0.5", "log.interval_s=0.5", "log.progress=false", *extra])
    return run_dir, summary


def check_run_dir(run_dir, summary, mode):
    assert os.path.isfile(os.path.join(run_dir, "config.yaml"))
    assert glob.glob(os.path.join(run_dir, "tb", "events.out.tfevents.*"))
    assert os.path.isfile(os.path.join(run_dir, "checkpoints", "best.safetensors"))
    on_disk = json.load(open(os.path.join(run_dir, "summary.json")))
    assert SUMMARY_KEYS <= set(on_disk)
    assert on_disk == json.loads(json.dumps(summary))
    assert summary["mode"] == mode and summary["stop_reason"] == "max_env_steps"
    assert summary["env_steps"] >= 6000 and summary["updates"] > 0
    assert summary["best_eval_return"] is not None
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    assert rows and list(rows[0]) == METRIC_COLUMNS
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] == summary["env_steps"]
    assert any(r["policy_lag_mean"] for r in rows)
    assert any(r["eval_return_mean"] for r in rows)
    # The learner's own diagnostics, averaged per log row: DQN reports its Q-values and gradient norm.
    learner = [json.loads(line) for line in open(os.path.join(run_dir, "learner.jsonl"))]
    assert learner and {"wall_s", "env_steps", "updates", "q_mean", "grad_norm"} <= set(learner[0])
    assert "priorities" not in learner[0] and "loss" not in learner[0]
    assert [r["updates"] for r in learner] == sorted(r["updates"] for r in learner)
    assert learner[-1]["updates"] <= summary["updates"]
    check_rate_limiter(rows, summary)
    return rows


def check_rate_limiter(rows, summary):
    """The sample-to-insert ratio held within the error buffer (and exactly, to a batch, after the final
    catch-up), nothing was sampled before min_size items were stored, and blocked time was counted."""
    rl = summary["rate_limiter"]
    assert rl["inserts"] == summary["env_steps"]  # one n-step transition per env step
    owed = rl["samples_per_insert"] * (rl["inserts"] - 1000)
    assert rl["samples"] == summary["updates"] * 512
    assert -512 < rl["samples"] - owed <= rl["error_buffer"], rl
    assert all(int(r["env_steps"]) >= 1000 for r in rows if int(r["updates"]) > 0)
    # Sampling blocks when the learner is ahead: so at every logged moment, not only at the end.
    ahead = [int(r["updates"]) * 512 - rl["samples_per_insert"] * max(0, int(r["env_steps"]) - 1000) for r in rows]
    assert max(ahead) <= rl["error_buffer"], (max(ahead), rl)
    assert 0.0 <= rl["workers_blocked_frac"] <= 1.0 and 0.0 <= rl["learner_blocked_frac"] <= 1.0
    assert all(r["workers_blocked_frac"] != "" for r in rows)


def test_single_mode_end_to_end(tmp_path):
    run_dir, summary = short_run(tmp_path, "single")
    check_run_dir(run_dir, summary, "single")
    assert summary["workers"] == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_distributed_modes_end_to_end(ray_session, tmp_path, mode):
    run_dir, summary = short_run(tmp_path, mode)
    rows = check_run_dir(run_dir, summary, mode)
    assert summary["workers"] == 2
    ready = [float(r["workers_ready_mean"]) for r in rows if r["workers_ready_mean"]]
    assert ready
    if mode == "sync":
        assert all(r == 2.0 for r in ready)
        assert all(r["workers_late_mean"] in ("", "0.0") for r in rows)
    else:
        assert all(0.0 <= r <= 2.0 for r in ready)

