"""Traces from real runs of every mode, and the timeline / report / plot commands on them."""
import json
import os

import matplotlib.image
import pytest

from distrl import train
from distrl.cli import main
from distrl.observe.trace_check import validate_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APEX = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
TRACED = ["log.trace=true", "log.progress=false", "log.tensorboard=false", "eval.target_return=null",
          "eval.interval_s=0.5"]
LANES = {"single": {"main", "evaluator"},
         "sync": {"driver", "learner", "replay", "parameter server", "worker 0", "worker 1", "evaluator"}}
LANES["async"] = LANES["sync"]
# Sample calls a worker can have queued when the run stops (AsyncGather keeps two): fragments that no replay added.
IN_FLIGHT = {"single": 0, "sync": 1, "async": 2}
WORKERS = 2


def lanes(trace: dict) -> set[str]:
    return {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


@pytest.fixture(scope="module", params=["single", "sync", "async"])
def traced_run(request, tmp_path_factory):
    if request.param != "single":
        request.getfixturevalue("ray_session")
    run_dir = str(tmp_path_factory.mktemp("trace") / request.param)
    train(APEX, run_dir=run_dir, overrides=[f"mode={request.param}", f"workers={WORKERS}", "stop.max_env_steps=12000",
                                            "replay.min_size=1000", *TRACED])
    return request.param, run_dir


def test_every_mode_writes_a_valid_trace_with_every_role(traced_run):
    mode, run_dir = traced_run
    path = os.path.join(run_dir, "trace.json")
    assert validate_trace(path) == []  # format, nesting per thread, paired flows, monotone time
    trace = json.load(open(path))
    assert lanes(trace) == LANES[mode]
    spans = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"sample", "env_step", "inference", "replay_add", "update_block", "publish", "evaluate"} <= spans
    flows = {e["cat"] for e in trace["traceEvents"] if e["ph"] in "sf"}
    assert "fragment" in flows and ("weights" in flows or mode == "single")


def test_recording_needed_no_repair(traced_run):
    """validate_trace sees the file after the writer has sorted, clipped and paired: the writer's own
    counts say whether recording itself was right."""
    mode, run_dir = traced_run
    other = json.load(open(os.path.join(run_dir, "trace.json")))["otherData"]
    assert not any(other["dropped"].values()), other["dropped"]  # so nothing below is the ring bound's doing
    assert other["spans_clipped"] == 0  # spans nested per thread as recorded
    assert other["events_out_of_order"] == 0  # every thread recorded its events in the order they ended
    assert other["flow_halves_unbound"] == 0  # every flow half inside a span of its thread
    assert other["flow_ends_orphaned"] == 0  # every consumer's producer is in the trace
    assert other["flow_starts_unconsumed"].get("fragment", 0) <= IN_FLIGHT[mode] * WORKERS, other


def test_the_rate_limiter_hold_is_a_span_on_its_own_track(traced_run):
    mode, run_dir = traced_run  # replay.min_size holds the learner at the start of every run
    events = json.load(open(os.path.join(run_dir, "trace.json")))["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    held = [e for e in events if e["name"] == "learner_held" and e["ph"] == "X"]
    assert held and all(e["dur"] > 0 for e in held)
    assert {(names[e["pid"]], threads[(e["pid"], e["tid"])]) for e in held} == \
        {("main" if mode == "single" else "driver", "rate limiter")}


def test_timeline_report_and_plot_on_a_real_run(traced_run, capsys):
    mode, run_dir = traced_run
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
    assert report["bottleneck"]["verdict"]


def test_the_trace_is_bounded_by_each_process_ring(ray_session, tmp_path):
    run_dir = str(tmp_path / "run")
    train(APEX, run_dir=run_dir, overrides=["mode=async", f"workers={WORKERS}", "stop.max_env_steps=8000",
                                            "log.trace_events=300", *TRACED])
    trace = json.load(open(os.path.join(run_dir, "trace.json")))
    per_pid = {}
    for e in trace["traceEvents"]:
        if e["ph"] != "M":
            per_pid[e["pid"]] = per_pid.get(e["pid"], 0) + 1
    assert per_pid and max(per_pid.values()) <= 300
    other = trace["otherData"]
    dropped = other["dropped"]
    assert sum(dropped.values()) > 0  # the workers' rings overflowed and said so
    # Evicting the oldest events never breaks nesting, and a flow half is recorded before the span that
    # holds it, so it leaves the ring first: no surviving half lacks its span.
    assert other["spans_clipped"] == other["events_out_of_order"] == other["flow_halves_unbound"] == 0
    # A consumer is orphaned only by its producer's eviction: a fragment has one consumer (the replay),
    # a publish at most one per worker and the evaluator.
    producers_lost = sum(n for name, n in dropped.items() if name.startswith("worker"))
    assert other["flow_ends_orphaned"] <= producers_lost + (WORKERS + 1) * dropped["learner"]


@pytest.mark.parametrize("case, overrides, verdict", [
    ("slow learner", ["learner.batch_size=4096", "replay.samples_per_insert=256"], "learner-bound"),
    ("slow env", ["env.id=distrl.envs.testing:SlowCartPole-v1", "replay.samples_per_insert=0.5",
                  "learner.batch_size=32"], "sampling-bound"),
])
def test_report_names_the_bottleneck(ray_session, tmp_path, capsys, case, overrides, verdict):
    run_dir = str(tmp_path / "run")
    train(APEX, run_dir=run_dir, overrides=["mode=async", "workers=2", "stop.max_seconds=12",
                                            "stop.max_env_steps=40000", *TRACED, *overrides])
    capsys.readouterr()
    assert main(["report", run_dir, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bottleneck"]["verdict"] == verdict, report["bottleneck"]
