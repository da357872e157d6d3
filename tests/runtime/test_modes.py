"""Each mode end to end on CartPole-v1 through the real path (Ray actors for sync/async): one traced run per
mode writes a complete run dir (config, TensorBoard, checkpoints, summary, metrics, the learner's
diagnostics), holds the rate limiter's ratio, and writes a valid trace with every role, which the
timeline, report and plot commands read."""
import csv
import glob
import json
import os

import matplotlib.image
import pytest

from distrl import train
from distrl.cli import main
from distrl.observe import METRIC_COLUMNS
from distrl.observe.trace_check import validate_trace
from tests.runtime.test_trace import (IN_FLIGHT, WORKERS, assert_fragments_flow_from_sample_to_replay_add,
                                      assert_no_repair, lanes, load_trace, run_lanes)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
STEPS = 12000
SUMMARY_KEYS = {"algo", "env", "mode", "workers", "seed", "wall_s", "env_steps", "updates", "env_steps_per_s",
                "best_eval_return", "solved", "time_to_solve_s", "stop_reason"}
LANES = {"single": {"main", "evaluator"},
         "sync": {"driver", "learner", "replay", "parameter server", "worker 0", "worker 1", "evaluator"}}
LANES["async"] = LANES["sync"]


def check_run_dir(run_dir, summary, mode):
    assert os.path.isfile(os.path.join(run_dir, "config.yaml"))
    assert glob.glob(os.path.join(run_dir, "tb", "events.out.tfevents.*"))
    assert os.path.isfile(os.path.join(run_dir, "checkpoints", "best.safetensors"))
    on_disk = json.load(open(os.path.join(run_dir, "summary.json")))
    assert SUMMARY_KEYS <= set(on_disk)
    assert on_disk == json.loads(json.dumps(summary))
    assert summary["mode"] == mode and summary["stop_reason"] == "max_env_steps"
    assert summary["env_steps"] >= STEPS and summary["updates"] > 0
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


def test_every_mode_writes_a_complete_run_dir(traced_run):
    mode, run_dir, summary = traced_run
    rows = check_run_dir(run_dir, summary, mode)
    assert summary["workers"] == (1 if mode == "single" else WORKERS)
    if mode == "single":
        return
    ready = [float(r["workers_ready_mean"]) for r in rows if r["workers_ready_mean"]]
    assert ready
    if mode == "sync":
        assert all(r == 2.0 for r in ready)
        assert all(r["workers_late_mean"] in ("", "0.0") for r in rows)
    else:
        assert all(0.0 <= r <= 2.0 for r in ready)


@pytest.fixture(scope="module", params=["single", "sync", "async"])
def traced_run(request, tmp_path_factory):
    """One traced Ape-X run per mode (2 workers in sync and async): (mode, run dir, summary). The single-mode
    run evaluates at fixed env steps, waiting for the result: its 12k steps can take about a second once this
    process has imported everything, less than its evaluator's start-up, and a run no evaluation of which
    finished has no best checkpoint."""
    if request.param != "single":
        request.getfixturevalue("ray_session")
    run_dir = str(tmp_path_factory.mktemp("mode") / request.param)
    evaluation = ["eval.interval_steps=6000"] if request.param == "single" else ["eval.interval_s=0.5"]
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[
        f"mode={request.param}", f"workers={WORKERS}", f"stop.max_env_steps={STEPS}", "replay.min_size=1000",
        "eval.target_return=null", *evaluation, "log.interval_s=0.5", "log.progress=false", "log.trace=true"])
    return request.param, run_dir, summary


def test_every_mode_writes_a_valid_trace_with_every_role(traced_run):
    mode, run_dir, _ = traced_run
    path = os.path.join(run_dir, "trace.json")
    assert validate_trace(path) == []  # format, nesting per thread, paired flows, monotone time
    trace = json.load(open(path))
    assert lanes(trace) == LANES[mode] == run_lanes(mode)
    spans = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"sample", "env_step", "inference", "replay_add", "update_block", "publish", "evaluate"} <= spans
    flows = {e["cat"] for e in trace["traceEvents"] if e["ph"] in "sf"}
    assert "fragment" in flows and ("weights" in flows or mode == "single")


def test_recording_needed_no_repair(traced_run):
    """validate_trace sees the file after the writer has sorted, clipped and paired: the writer's own
    counts say whether recording itself was right."""
    mode, run_dir, _ = traced_run
    trace = load_trace(run_dir)
    assert_no_repair(trace["otherData"], IN_FLIGHT[mode] * WORKERS)
    assert_fragments_flow_from_sample_to_replay_add(trace)


def test_the_rate_limiter_hold_is_a_span_on_its_own_track(traced_run):
    mode, run_dir, _ = traced_run  # replay.min_size holds the learner at the start of every run
    events = json.load(open(os.path.join(run_dir, "trace.json")))["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    held = [e for e in events if e["name"] == "learner_held" and e["ph"] == "X"]
    assert held and all(e["dur"] > 0 for e in held)
    assert {(names[e["pid"]], threads[(e["pid"], e["tid"])]) for e in held} == \
        {("main" if mode == "single" else "driver", "rate limiter")}


def test_timeline_report_and_plot_on_a_real_run(traced_run, capsys):
    mode, run_dir, _ = traced_run
    png = os.path.join(run_dir, "t.png")
    assert main(["timeline", run_dir, "-o", png]) == 0
    img = matplotlib.image.imread(png)
    assert img.shape[:2] == (160 + 40 * (len(LANES[mode]) + 1), 1600)  # + the rate limiter's track
    assert img[..., :3].std() > 0.05  # something was drawn, not a blank canvas
    assert main(["plot", run_dir, "-o", os.path.join(run_dir, "p.png")]) == 0
    img = matplotlib.image.imread(os.path.join(run_dir, "p.png"))
    assert img.shape[:2] == (620, 1400) and img[..., :3].std() > 0.05
    capsys.readouterr()
    assert main(["report", run_dir, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bottleneck"]["verdict"] and report["fragment_in_flight"]["n"] > 0
