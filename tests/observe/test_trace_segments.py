"""A resumed run's trace.json keeps the earlier segments' events, cut where the run resumed
(distrl.observe.trace_segments), and the timeline and report read it."""
import json
import os

import pytest

from distrl.observe.report import run_report
from distrl.observe.timeline import read_trace, title
from distrl.observe.trace_check import validate_trace
from distrl.observe.trace_segments import PID_SPACE, write_run_trace

START = 1_700_000_000.0  # Unix time of the run's 0 s in the first segment
CUT = 6.0  # run seconds of the checkpoint the second segment resumed from
START2 = START + 3600.0  # the run was down an hour: 0 s of the second segment's clock, in Unix time
EXTRA = {"mode": "sync", "algo": "ppo", "env": "CartPole-v1"}


class Proc:
    """One process's drain, stamped on a segment's clock (`origin`: Unix time of its 0 s)."""

    def __init__(self, role, pid, origin, index=None):
        self.origin, self.events = origin, []
        self.meta = {"role": role, "index": index, "pid": pid, "host": "h", "dropped": 0,
                     "threads": {1: (pid, "MainThread")}}

    def span(self, name, cat, t, dur):
        self.events.append(("X", round((self.origin + t) * 1e6), round(dur * 1e6), name, cat, 1, None))

    def flow(self, ph, flow_id, t):
        self.events.append((ph, round((self.origin + t) * 1e6), 0, "fragment", flow_id, 1, None))

    def drained(self):
        return {"meta": self.meta, "events": self.events}


def segment(origin, seconds, pids, ids_from=0, learner_spans=()):
    """A driver gathering each second, a worker sampling a fragment each second that the replay adds."""
    driver, worker, replay, learner = (Proc("driver", pids[0], origin), Proc("worker", pids[1], origin, 0),
                                       Proc("replay", pids[2], origin), Proc("learner", pids[3], origin))
    for t in seconds:
        driver.span("gather", "wait", t, 0.9)
        worker.span("sample", "rollout", t + 0.1, 0.7)
        worker.flow("s", ids_from + t, t + 0.79)
        replay.span("replay_add", "replay", t + 0.85, 0.05)
        replay.flow("f", ids_from + t, t + 0.86)
    for t, dur in learner_spans:
        learner.span("update_block", "learning", t, dur)
    return [p.drained() for p in (driver, worker, replay, learner)]


def resumed_from(run_dir, *wall_s):
    with open(os.path.join(run_dir, "resumes.jsonl"), "a") as fh:
        for w in wall_s:
            fh.write(json.dumps({"checkpoint": "ckpt", "resumed_at_wall_s": w}) + "\n")


def load(run_dir):
    with open(os.path.join(run_dir, "trace.json")) as fh:
        return json.load(fh)


def processes(obj):
    return {e["pid"]: e["args"]["name"] for e in obj["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def spans(obj, pid):
    return [(e["name"], e["ts"] / 1e6, e["dur"] / 1e6) for e in obj["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]


@pytest.fixture
def two_segments(tmp_path):
    """Driver pid 10 in both segments (an in-process resume); the first segment's learner had pid 30,
    which the second segment's worker has now."""
    run_dir = str(tmp_path)
    write_run_trace(run_dir, segment(START, range(10), (10, 20, 12, 30), learner_spans=[(5.5, 1.0), (7.0, 1.0)]),
                    START, EXTRA)
    first = load(run_dir)
    resumed_from(run_dir, CUT)
    write_run_trace(run_dir, segment(START2, range(7, 10), (10, 30, 40, 41), ids_from=100,
                                     learner_spans=[(7.5, 0.5)]), START2, EXTRA)
    return run_dir, first, load(run_dir)


def test_a_resumed_run_appends_its_trace_to_the_earlier_one_cut_at_the_checkpoint(two_segments):
    run_dir, first, obj = two_segments
    assert validate_trace(obj) == []
    other = obj["otherData"]
    assert other["segments"] == [{"start_time": START, "from_s": 0.0, **EXTRA},
                                 {"start_time": START2, "from_s": CUT, **EXTRA}]
    assert other["start_time"] == START and other["resumes_seen"] == 1
    names = processes(obj)
    # One driver lane for both segments; the earlier learner moved off the pid the new worker has.
    assert sorted(names.items()) == sorted({10: "driver", 20: "worker 0", 12: "replay", 30 + PID_SPACE: "learner",
                                            30: "worker 0", 40: "replay", 41: "learner"}.items())
    labels = {e["pid"]: e["args"]["labels"] for e in obj["traceEvents"] if e["name"] == "process_labels"}
    assert labels[30 + PID_SPACE].endswith("pid 30")  # the real pid still names it
    gathers = [t for name, t, _ in spans(obj, 10)]
    assert gathers == [0, 1, 2, 3, 4, 5, 7, 8, 9]  # the earlier segment's from 6 s on were done again
    assert spans(obj, 20) == [("sample", t + 0.1, pytest.approx(0.7)) for t in range(6)]
    assert spans(obj, 30 + PID_SPACE) == [("update_block", 5.5, 0.5)]  # ended at the checkpoint
    assert next(e for e in obj["traceEvents"] if e["pid"] == 30 + PID_SPACE and e["ph"] == "X")["args"] == \
        {"cut_at_resume": True}
    assert [t for _, t, _ in spans(obj, 30)] == [7.1, 8.1, 9.1]  # the new segment's as it recorded them
    # Cut: gathers, samples and adds of 6-9 s with both halves of their 4 fragment flows, and one update.
    assert (other["events_cut_at_resume"], other["spans_cut_at_resume"]) == (4 * 5 + 1, 1)
    flows = [e for e in obj["traceEvents"] if e["ph"] in ("s", "f")]
    assert len(flows) == 2 * (6 + 3) and len({e["id"] for e in flows}) == 6 + 3  # every pair kept, ids apart
    assert other["dropped"] == {"driver": 0, "worker 0": 0, "replay": 0, "learner": 0}


def test_the_timeline_and_report_show_where_the_run_resumed(two_segments, tmp_path):
    run_dir, _, _ = two_segments
    trace = read_trace(run_dir)
    assert title(trace, (0.0, 10.0)).endswith("resumed at 6.00 s")
    assert {ln.label for ln in trace.lanes} >= {f"worker 0 (pid 20)", "worker 0 (pid 30)", "driver"}
    text = run_report(run_dir)
    assert "resumed at 6.00 s" in text
    report = json.loads(run_report(run_dir, as_json=True))
    assert report["resumed_at_s"] == [CUT]
    # Each worker process has its share over its own lane: the earlier one from its first span to its last.
    workers = {p["pid"]: p for p in report["processes"] if p["role"] == "worker"}
    assert workers[20]["wall_s"] == pytest.approx(5.8 - 0.1) and workers[20]["busy"] == pytest.approx(6 * 0.7 / 5.7,
                                                                                                      abs=1e-3)


def test_a_later_resume_from_an_earlier_checkpoint_cuts_there(tmp_path):
    """A segment that wrote no trace (untraced, or killed) resumed from 8 s; the next one from 6 s, the
    checkpoint before: the first segment's events are cut at the earlier of the two."""
    run_dir = str(tmp_path)
    write_run_trace(run_dir, segment(START, range(10), (10, 20, 12, 13)), START, EXTRA)
    resumed_from(run_dir, 8.0, CUT)
    write_run_trace(run_dir, segment(START2, range(7, 9), (50, 51, 52, 53), ids_from=100), START2, EXTRA)
    obj = load(run_dir)
    assert validate_trace(obj) == [] and [s["from_s"] for s in obj["otherData"]["segments"]] == [0.0, CUT]
    assert [t for _, t, _ in spans(obj, 10)] == [0, 1, 2, 3, 4, 5]
    resumed_from(run_dir, 8.5)  # a third segment: the first two stay, cut at 8.5 s
    write_run_trace(run_dir, segment(START2 + 60, [9], (60, 61, 62, 63), ids_from=200), START2 + 60, EXTRA)
    obj = load(run_dir)
    assert validate_trace(obj) == [] and [s["from_s"] for s in obj["otherData"]["segments"]] == [0.0, CUT, 8.5]
    assert [t for _, t, _ in spans(obj, 50)] == [7, 8]
    assert obj["otherData"]["spans_cut_at_resume"] == 2  # the second segment's gather and sample across 8.5 s


def test_a_trace_not_left_by_an_earlier_segment_is_replaced(tmp_path):
    run_dir = str(tmp_path)
    with open(os.path.join(run_dir, "trace.json"), "w") as fh:
        fh.write("{not json")
    resumed_from(run_dir, CUT)
    write_run_trace(run_dir, segment(START2, [7], (10, 20, 12, 13)), START2, EXTRA)
    obj = load(run_dir)
    assert validate_trace(obj) == [] and obj["otherData"]["earlier_trace"].startswith("unreadable")
    assert obj["otherData"]["segments"] == [{"start_time": START2, "from_s": CUT, **EXTRA}]
    # Written again with no resume since (it already counts the one in resumes.jsonl): replaced, not appended to.
    write_run_trace(run_dir, segment(START2, [8], (10, 20, 12, 13)), START2, EXTRA)
    obj = load(run_dir)
    assert [t for _, t, _ in spans(obj, 10)] == [8] and len(obj["otherData"]["segments"]) == 1
