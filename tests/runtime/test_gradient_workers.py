"""Gradient workers through real Ray actors: the learner shares each step's gradient with them."""
import json
import os
import threading

from distrl import train
from tests.runtime.processes import kill_one_once_logging, stop_once_back
from tests.runtime.test_trace import assert_trace_has_every_lane, run_lanes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUIET = ["log.progress=false", "log.tensorboard=false", "log.trace=true"]


def shard_spans(run_dir: str) -> dict[str, dict[int, int]]:
    """Gradient-worker process name -> {pid: how many shard gradients that process computed}."""
    with open(os.path.join(run_dir, "trace.json")) as fh:
        events = json.load(fh)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    out: dict[str, dict[int, int]] = {}
    for e in events:
        if e.get("ph") == "X" and e["name"] == "shard_gradient":
            by_pid = out.setdefault(names[e["pid"]], {})
            by_pid[e["pid"]] = by_pid.get(e["pid"], 0) + 1
    return out


def test_apex_async_with_two_gradient_workers_trains_and_both_share_every_step(ray_session, tmp_path):
    run_dir = str(tmp_path / "run")
    summary = train(os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml"), run_dir=run_dir,
                    overrides=["mode=async", "workers=1", "learner.num_gradient_workers=2", "replay.min_size=500",
                               "learner.batch_size=64", "stop.max_env_steps=2500", "eval.target_return=null", *QUIET])
    assert summary["updates"] > 20 and summary["nonfinite_updates"] == 0
    assert_trace_has_every_lane(run_dir, run_lanes("async", workers=1, gradient_workers=2))
    spans = {name: sum(by_pid.values()) for name, by_pid in shard_spans(run_dir).items()}
    assert set(spans) == {"gradient worker 0", "gradient worker 1"}
    # Every update asks both for a shard (traces may have dropped the oldest, never one side only).
    assert abs(spans["gradient worker 0"] - spans["gradient worker 1"]) <= 2


def test_a_killed_gradient_worker_is_restarted_and_ppo_trains_on(ray_session, tmp_path):
    """Its gradient call is retried on the restarted process (a pure function of weights and shard); the run
    trains on and is stopped (as a Ctrl-C would) a few rows after the restart. That PPO still solves with a
    gradient worker's fault is tested with a hung one (test_hangs.py)."""
    run_dir, done = str(tmp_path / "run"), threading.Event()
    thread, killed = kill_one_once_logging(run_dir, "GradientWorker")
    stop = threading.Thread(target=stop_once_back, args=(run_dir, done, 8), daemon=True)
    stop.start()
    try:
        summary = train(os.path.join(ROOT, "configs", "ppo_cartpole.yaml"), run_dir=run_dir,
                        overrides=["mode=sync", "workers=1", "seed=0", "learner.num_gradient_workers=2",
                                   "stop.max_seconds=150", "eval.target_return=null", "log.interval_s=0.25", *QUIET])
    finally:
        done.set()
        stop.join(timeout=5)
    thread.join(timeout=5)
    assert len(killed) == 1
    assert summary["stop_reason"] == "interrupted" and summary["failure"] is None, summary
    assert summary["gradient_worker_restarts"] == 1, summary
    assert summary["learner_restarts"] == 0 and summary["nonfinite_updates"] == 0, summary
    # The killed process was one of this run's two gradient workers; both lanes have shards from a process
    # other than it (a dead process keeps only what a checkpoint pulled before its death): the killed one
    # answered again from a restarted process.
    spans = shard_spans(run_dir)
    assert set(spans) == {"gradient worker 0", "gradient worker 1"}, spans
    assert all(set(by_pid) - {killed[0][0]} for by_pid in spans.values()), (killed, spans)
    assert sum(len(by_pid) for by_pid in spans.values()) <= 3, spans  # one restart, no more
