"""Traces: bounded by each process's ring, the report's bottleneck verdict, PPO on the trajectory FIFO, a
resumed run and an actor that dies, and the timeline / report / plot commands on them. Each mode's own
traced run is checked in test_modes.py; the helpers here serve every module that checks a trace."""
import glob
import json
import os
import signal
import threading
import time

import matplotlib.image
import pytest

from distrl import resume, train
from distrl.cli import main
from distrl.observe.trace_check import validate_trace
from tests.runtime.processes import pids_of, stop_as_ctrl_c

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APEX = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
PPO = os.path.join(ROOT, "configs", "ppo_cartpole.yaml")
TRACED = ["log.trace=true", "log.progress=false", "log.tensorboard=false", "eval.target_return=null",
          "eval.interval_s=0.5"]
# Sample calls a worker can have queued when the run stops (AsyncGather keeps two): fragments that no replay added.
IN_FLIGHT = {"single": 0, "sync": 1, "async": 2}
WORKERS = 2


def lanes(trace: dict) -> set[str]:
    return set(processes(trace).values())


def processes(trace: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def load_trace(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "trace.json")) as fh:
        return json.load(fh)


def run_lanes(mode: str, workers: int = WORKERS, inference: bool = False, gradient_workers: int = 0) -> set[str]:
    """The processes (lanes) a run's trace must have: the mode's roles, one per worker, and the central
    inference server and gradient workers when the run has them."""
    roles = {"main", "evaluator"} if mode == "single" else {"driver", "learner", "replay", "parameter server",
                                                            "evaluator", *(f"worker {i}" for i in range(workers))}
    return roles | ({"inference"} if inference else set()) | {f"gradient worker {i}" for i in range(gradient_workers)}


def assert_trace_has_every_lane(run_dir: str, lanes_expected: set[str]) -> dict:
    """For any traced run (e.g. the central-inference and gradient-worker runs): its trace.json is valid
    and holds exactly these processes; returns the trace."""
    trace = load_trace(run_dir)
    assert validate_trace(trace) == []
    assert lanes(trace) == lanes_expected
    return trace


def assert_no_repair(other: dict, in_flight: int) -> None:
    """The writer's counts of what it repaired: none, but fragments still in flight at the end."""
    assert not any(other["dropped"].values()), other["dropped"]  # so nothing below is the ring bound's doing
    assert other["spans_clipped"] == 0  # spans nested per thread as recorded
    assert other["events_out_of_order"] == 0  # every thread recorded its events in the order they ended
    assert other["flow_halves_unbound"] == 0  # every flow half inside a span of its thread
    assert other["flow_ends_orphaned"] == 0  # every consumer's producer is in the trace
    assert other["flow_starts_unconsumed"].get("fragment", 0) <= in_flight, other


def enclosing(spans: dict, half: dict) -> tuple[dict, list[dict]]:
    """The innermost span of the flow half's thread that holds it, and the spans inside that one."""
    thread = spans[(half["pid"], half["tid"])]
    span = min((e for e in thread if e["ts"] <= half["ts"] <= e["ts"] + e["dur"]), key=lambda e: e["dur"])
    return span, [e for e in thread if e is not span and span["ts"] <= e["ts"] <= span["ts"] + span["dur"]]


def assert_fragments_flow_from_sample_to_replay_add(trace: dict) -> None:
    """A fragment's transfer is the flow from the end of the worker's `sample` (after all its env steps) to
    the start of the replay's `replay_add` (before it stores anything): the time between is in flight."""
    events, names, spans = trace["traceEvents"], processes(trace), {}
    for e in events:
        if e["ph"] == "X":
            spans.setdefault((e["pid"], e["tid"]), []).append(e)
    pairs: dict[int, dict] = {}
    for e in events:
        if e["ph"] in ("s", "f") and e["cat"] == "fragment":
            pairs.setdefault(e["id"], {})[e["ph"]] = e
    assert pairs
    for pair in pairs.values():
        (out, steps), (into, inside) = enclosing(spans, pair["s"]), enclosing(spans, pair["f"])
        assert out["name"] == "sample" and names[out["pid"]].split()[0] in ("worker", "main")
        assert steps and all(e["ts"] + e["dur"] <= pair["s"]["ts"] for e in steps)
        assert into["name"] == "replay_add" and names[into["pid"]] in ("replay", "main") and not inside
        assert pair["s"]["ts"] <= pair["f"]["ts"]


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


# Each run stops after a set amount of its bottleneck's work (seconds of it, unloaded), whatever its actors'
# start-up took: the verdict needs a few seconds of training in the report's window.
@pytest.mark.parametrize("case, overrides, verdict", [
    ("slow learner", ["learner.batch_size=4096", "replay.samples_per_insert=256", "stop.max_updates=300"],
     "learner-bound"),
    # The env waits on the clock, as on a simulator: the workers are busy sampling, not on the CPU.
    ("slow env", ["env.id=distrl.envs.testing:WaitingCartPole-v1", "replay.samples_per_insert=0.5",
                  "learner.batch_size=32", "stop.max_env_steps=6000"], "sampling-bound"),
])
def test_report_names_the_bottleneck(ray_session, tmp_path, capsys, case, overrides, verdict):
    run_dir = str(tmp_path / "run")
    train(APEX, run_dir=run_dir, overrides=["mode=async", "workers=2", "stop.max_seconds=60", *TRACED, *overrides])
    capsys.readouterr()
    assert main(["report", run_dir, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bottleneck"]["verdict"] == verdict, report["bottleneck"]


# --- PPO (the trajectory FIFO) in sync mode, then resumed with a worker killed -----------------

@pytest.fixture(scope="module")
def ppo_run(ray_session, tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("trace") / "ppo")
    summary = train(PPO, run_dir=run_dir, overrides=["mode=sync", f"workers={WORKERS}", "stop.max_env_steps=4000",
                                                     *TRACED])
    return run_dir, summary, load_trace(run_dir)


def test_a_ppo_run_in_sync_mode_writes_a_valid_trace_with_every_role(ppo_run):
    run_dir, summary, trace = ppo_run
    assert summary["updates"] > 0
    assert validate_trace(trace) == []
    assert lanes(trace) == run_lanes("sync")
    spans = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"sample", "env_step", "inference", "pull_weights", "idle", "replay_add", "sample_batch", "update_block",
            "publish", "evaluate", "gather", "checkpoint"} <= spans
    assert {e["cat"] for e in trace["traceEvents"] if e["ph"] in "sf"} == {"fragment", "weights"}
    assert_no_repair(trace["otherData"], IN_FLIGHT["sync"] * WORKERS)
    assert_fragments_flow_from_sample_to_replay_add(trace)


def complete_checkpoints(run_dir: str) -> list[int]:
    return sorted(int(os.path.basename(os.path.dirname(p))[len("ckpt-"):])
                  for p in glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*", "DONE")))


def metrics_rows_with_a_worker_restart(run_dir: str) -> int:
    with open(os.path.join(run_dir, "metrics.csv")) as fh:
        rows = fh.read().splitlines()
    column = rows[0].split(",").index("worker_restarts")
    return sum(1 for row in rows[1:] if row.split(",")[column:column + 1] not in ([], [""], ["0"]))


def metrics_rows(run_dir: str) -> int:
    with open(os.path.join(run_dir, "metrics.csv")) as fh:
        return len(fh.read().splitlines()) - 1


def restarted(run_dir: str) -> bool:
    """A worker's restart is complete (its line in faults.log)."""
    path = os.path.join(run_dir, "faults.log")
    return os.path.exists(path) and ", restarted " in open(path).read()


def kill_a_worker_then_stop(run_dir: str, timeout_s: float = 120.0):
    """A started thread that, in the run about to be resumed in `run_dir`, SIGKILLs one rollout worker once
    two checkpoints of its own have pulled the actors' rings, and stops the run as a Ctrl-C would once the
    worker's restart is in faults.log and ten more metrics rows have been written (its restart is counted
    when Ray sees the death; by then the new process has sampled). The list it returns gets (pid, time) of
    the kill."""
    before, done, killed = set(pids_of("RolloutWorker")), complete_checkpoints(run_dir), []

    def wait_until(condition) -> bool:
        deadline = time.time() + timeout_s
        while not condition():
            if time.time() > deadline:
                return False
            time.sleep(0.1)
        return True

    def run():
        if wait_until(lambda: len([n for n in complete_checkpoints(run_dir) if n > max(done)]) >= 2):
            ours = [pid for pid in pids_of("RolloutWorker") if pid not in before]
            os.kill(ours[0], signal.SIGKILL)
            killed.append((ours[0], time.time()))
            wait_until(lambda: metrics_rows_with_a_worker_restart(run_dir) >= 1 and restarted(run_dir))
            rows = metrics_rows(run_dir)
            # Ten more rows (5 s): on a loaded machine the new process's first fragment can take a few seconds.
            wait_until(lambda: metrics_rows(run_dir) >= rows + 10)
        stop_as_ctrl_c()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, killed


@pytest.fixture(scope="module")
def resumed_ppo_run(ppo_run):
    run_dir, first, _ = ppo_run
    thread, killed = kill_a_worker_then_stop(run_dir)
    called = time.time()
    summary = resume(run_dir, overrides=["stop.max_env_steps=null", f"stop.max_seconds={first['wall_s'] + 120}",
                                         "checkpoint.interval_s=0.5", "log.interval_s=0.5"])
    summary["called_at"] = called
    thread.join(timeout=5)
    with open(os.path.join(run_dir, "resumes.jsonl")) as fh:
        resumed_at = json.loads(fh.read().splitlines()[-1])["resumed_at_wall_s"]
    return run_dir, summary, killed, resumed_at, load_trace(run_dir)


def test_a_resumed_run_keeps_the_earlier_segments_trace_up_to_its_checkpoint(ppo_run, resumed_ppo_run):
    _, first, first_trace = ppo_run
    run_dir, summary, _, resumed_at, trace = resumed_ppo_run
    assert summary["stop_reason"] == "interrupted" and summary["env_steps"] > first["env_steps"]
    assert validate_trace(trace) == []
    (one, two), first_start = trace["otherData"]["segments"], first_trace["otherData"]["start_time"]
    assert (one["start_time"], one["from_s"], two["from_s"]) == (first_start, 0.0, resumed_at)
    assert resumed_at <= first["wall_s"]  # the first segment's last checkpoint
    # The resumed clock: its run time `resumed_at` fell between the resume call and the resumed run's end.
    assert summary["called_at"] <= two["start_time"] + resumed_at <= two["start_time"] + summary["wall_s"]
    cut, names, first_names = round(resumed_at * 1e6), processes(trace), processes(first_trace)

    def spans(obj, where, keep):
        return {(where[e["pid"]], e["name"], e["ts"], e["dur"]) for e in obj["traceEvents"] if e["ph"] == "X" and keep(e)}

    before_cut = spans(first_trace, first_names, lambda e: e["ts"] + e["dur"] <= cut)
    assert before_cut and before_cut <= spans(trace, names, lambda e: True)  # kept as recorded
    driver = next(pid for pid, name in first_names.items() if name == "driver")  # this test process, both times
    assert names[driver] == "driver"
    assert all(e["ts"] + e.get("dur", 0) <= cut for e in trace["traceEvents"]
               if e["ph"] != "M" and e["pid"] in set(first_names) - {driver})  # nothing after the checkpoint
    later = [e["ts"] for e in trace["traceEvents"] if e["ph"] != "M" and e["pid"] not in first_names]
    assert later and min(later) >= cut  # the resumed segment's events, from its checkpoint on
    assert lanes(trace) == run_lanes("sync")
    for role in ("learner", "replay", "evaluator", "worker 0", "worker 1"):  # one process of each per segment
        assert list(names.values()).count(role) >= 2, (role, names)


def test_an_actor_that_dies_keeps_the_events_pulled_at_checkpoints_before_its_death(resumed_ppo_run):
    run_dir, summary, killed, resumed_at, trace = resumed_ppo_run
    assert len(killed) == 1 and summary["worker_restarts"] == 1, summary
    (pid, when), names = killed[0], processes(trace)
    assert pid in names, "the killed worker's events were lost with it"
    died_at = (when - trace["otherData"]["segments"][-1]["start_time"]) * 1e6  # on the run's clock, µs
    own = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]
    assert [e for e in own if e["name"] == "sample"] and max(e["ts"] + e["dur"] for e in own) <= died_at
    after = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "sample" and e["pid"] != pid
             and names[e["pid"]] == names[pid] and e["ts"] > died_at]
    assert after  # its replacement's lane, under the same name


def test_timeline_and_report_on_a_resumed_run(resumed_ppo_run, capsys):
    run_dir, _, _, resumed_at, _ = resumed_ppo_run
    png = os.path.join(run_dir, "t.png")
    assert main(["timeline", run_dir, "--from", str(resumed_at - 1), "--to", str(resumed_at + 3), "-o", png]) == 0
    assert matplotlib.image.imread(png)[..., :3].std() > 0.05
    capsys.readouterr()
    assert main(["report", run_dir, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["resumed_at_s"] == [resumed_at] and report["bottleneck"]["verdict"]
