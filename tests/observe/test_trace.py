"""The recorder (distrl.observe.trace.Tracer), the trace.json writer and validate_trace."""
import copy
import json
import socket
import threading
import time

import pytest

from distrl.observe import trace as T
from distrl.observe.trace_check import validate_trace

START = time.time()


@pytest.fixture(autouse=True)
def fresh_process_tracer():
    """configure() replaces a process-wide tracer: each test starts with a disabled one (a Ray run earlier in
    the session leaves the driver's enabled), and the one before is put back after it."""
    saved, T._TRACER = T._TRACER, T.Tracer()
    yield
    T._TRACER = saved


def as_process(drained, pid):
    """A drain from this test process, relabelled as another process (every Tracer here shares our pid)."""
    out = copy.deepcopy(drained)
    out["meta"]["pid"] = pid
    out["meta"]["threads"] = {k: (pid if v[1] == "MainThread" else pid * 10 + 1, v[1])
                              for k, v in out["meta"]["threads"].items()}
    return out


def write(tmp_path, drained, **kw):
    path = str(tmp_path / "trace.json")
    T.write_trace(path, drained, START, **kw)
    with open(path) as fh:
        return path, json.load(fh)


def body(obj, pid=None, ph=None):
    return [e for e in obj["traceEvents"] if e["ph"] != "M" and (pid is None or e["pid"] == pid)
            and (ph is None or e["ph"] == ph)]


# --- the recorder --------------------------------------------------------------------------

def test_disabled_tracer_records_nothing_and_shares_one_span():
    tr = T.tracer()
    assert not tr.enabled
    assert tr.span("sample", "rollout") is tr.span("update_block", "learning")
    with tr.span("sample", "rollout", env_steps=3) as s:
        s.set(more=1)
    assert tr.begin("idle", "wait") is None
    tr.end(None, x=1)
    tr.complete("x", "wait", time.time(), 0.1)
    tr.instant("i", "driver")
    tr.flow_out("fragment", 1)
    tr.flow_in("fragment", 1)
    assert tr.drain()["events"] == [] and tr.drain()["meta"]["dropped"] == 0


def test_configure_enables_this_process_tracer():
    tr = T.configure("worker", 2, capacity=50, node="node-b")
    assert T.tracer() is tr and tr.enabled
    meta = tr.drain()["meta"]
    assert (meta["role"], meta["index"], meta["node"], meta["capacity"]) == ("worker", 2, "node-b", 50)
    assert meta["host"] == socket.gethostname()  # recorded with or without a Ray node id


def test_processes_are_labelled_by_host_and_by_ray_node_when_there_is_one(tmp_path):
    under_ray, no_ray = T.Tracer("worker", 0, enabled=True, node="3f9a01bc"), T.Tracer("main", enabled=True)
    for tr in (under_ray, no_ray):
        with tr.span("sample", "rollout"):
            pass
    _, obj = write(tmp_path, [as_process(under_ray.drain(), 20), as_process(no_ray.drain(), 10)])
    labels = {e["pid"]: e["args"]["labels"] for e in obj["traceEvents"] if e["name"] == "process_labels"}
    host = socket.gethostname()
    assert labels == {20: f"node 3f9a01bc, host {host}, pid 20", 10: f"host {host}, pid 10"}


def test_ring_keeps_the_newest_and_counts_the_dropped():
    tr = T.Tracer("learner", enabled=True, capacity=10)
    for i in range(25):
        tr.instant(f"e{i}", "driver")
    drained = tr.drain()
    assert [e[3] for e in drained["events"]] == [f"e{i}" for i in range(15, 25)]
    assert drained["meta"]["dropped"] == 15
    tr.instant("again", "driver")
    assert tr.drain()["meta"]["dropped"] == 0  # counted per drain


def test_span_nesting_and_args():
    tr = T.Tracer("worker", 0, enabled=True)
    with tr.span("sample", "rollout", env_steps=64) as outer:
        for _ in range(3):
            with tr.span("env_step", "env"):
                time.sleep(0.0005)
        outer.set(fragments=1)
    events = tr.drain()["events"]
    parent = next(e for e in events if e[3] == "sample")
    children = [e for e in events if e[3] == "env_step"]
    assert len(children) == 3 and parent[6] == {"env_steps": 64, "fragments": 1}
    for c in children:
        assert parent[1] <= c[1] and c[1] + c[2] <= parent[1] + parent[2]
        assert c[4] == "env" and c[2] >= 400


def test_begin_end_and_complete():
    tr = T.Tracer("learner", enabled=True, capacity=4)
    token = tr.begin("wait_batch", "wait")
    assert isinstance(token, int)
    time.sleep(0.001)
    tr.end(token, batches=2)
    tr.end(token)  # a second end of one token records nothing
    tr.end(12345)  # nor does an unknown token
    tr.complete("update_block", "learning", 100.5, 0.25, updates=8)
    (span, done) = tr.drain()["events"]
    assert span[:1] == ("X",) and span[3:5] == ("wait_batch", "wait") and span[2] >= 1000 and span[6] == {"batches": 2}
    assert done[1:5] == (100_500_000, 250_000, "update_block", "learning") and done[6] == {"updates": 8}
    for _ in range(6):  # begins that never end stay bounded by the capacity
        tr.begin("idle", "wait")
    assert len(tr._open) == 4 and tr.drain()["meta"]["dropped"] == 2


def test_flows_bind_to_the_enclosing_span_and_are_paired(tmp_path):
    worker, replay = T.Tracer("worker", 1, enabled=True), T.Tracer("replay", enabled=True)
    with worker.span("sample", "rollout"):
        worker.flow_out("fragment", 7)
    # Outside any span: it binds to nothing and is dropped. The sleeps keep it off the microsecond
    # its neighbours end and start at, where it would lie inside them (span bounds are inclusive).
    time.sleep(0.002)
    worker.flow_out("fragment", 8)
    time.sleep(0.002)
    with worker.span("sample", "rollout"):
        worker.flow_out("fragment", 10)  # still in flight when the trace was taken
    with replay.span("replay_add", "replay"):
        replay.flow_in("fragment", 7)
        replay.flow_in("fragment", 9)  # its producer fell out of a ring: dropped
    path, obj = write(tmp_path, [as_process(worker.drain(), 20), as_process(replay.drain(), 12)])
    flows = [e for e in obj["traceEvents"] if e["ph"] in ("s", "f")]
    assert sorted((e["ph"], e["pid"]) for e in flows) == [("f", 12), ("s", 20)]
    s, f = sorted(flows, key=lambda e: e["ph"], reverse=True)
    assert s["id"] == f["id"] and f["bp"] == "e" and s["cat"] == f["cat"] == "fragment"
    other = obj["otherData"]
    assert (other["flow_halves_unbound"], other["flow_ends_orphaned"], other["flow_starts_unconsumed"]) == \
        (1, 1, {"fragment": 1})
    assert other["flow_halves_dropped"] == 3 and other["spans_clipped"] == other["events_out_of_order"] == 0
    assert validate_trace(path) == []


def test_one_publish_pulled_by_many_draws_an_arrow_to_each(tmp_path):
    learner = T.Tracer("learner", enabled=True)
    with learner.span("publish", "transfer"):
        learner.flow_out("weights", 3)
    drains = [as_process(learner.drain(), 11)]
    for i in range(3):
        w = T.Tracer("worker", i, enabled=True)
        with w.span("pull_weights", "transfer"):
            w.flow_in("weights", 3)
        drains.append(as_process(w.drain(), 20 + i))
    path, obj = write(tmp_path, drains)
    ends = body(obj, ph="f")
    assert sorted(e["pid"] for e in ends) == [20, 21, 22] and len({e["id"] for e in ends}) == 3
    assert obj["otherData"]["flow_halves_dropped"] == 0  # one start, three consumers: nothing left alone
    assert validate_trace(path) == []


# --- the writer ----------------------------------------------------------------------------

def a_run():
    """Drains of a small run: every role, one of them with a second thread."""
    drains = []
    for pid, (role, index) in enumerate([("evaluator", None), ("worker", 1), ("worker", 0), ("replay", None),
                                         ("learner", None), ("driver", None), ("parameter_server", None)], 10):
        tr = T.Tracer(role, index, enabled=True)
        with tr.span("outer", "driver"), tr.span("inner", "wait"):
            tr.instant("tick", "driver")
        if role == "learner":
            thread = threading.Thread(target=tr.complete, args=("prefetch", "transfer", time.time(), 0.001),
                                      name="prefetch")
            thread.start()
            thread.join()
        drains.append(as_process(tr.drain(), pid))
    return drains


def test_writer_makes_valid_trace_event_json_with_every_process(tmp_path):
    path, obj = write(tmp_path, a_run(), extra={"mode": "async"})
    assert obj["displayTimeUnit"] == "ms" and obj["otherData"]["start_time"] == START
    assert obj["otherData"]["mode"] == "async" and set(obj["otherData"]["dropped"]) >= {"learner", "worker 0"}
    meta = {(e["pid"], e["name"]): e["args"] for e in obj["traceEvents"] if e["ph"] == "M"}
    names = {pid: args["name"] for (pid, key), args in meta.items() if key == "process_name"}
    assert sorted(names.values()) == ["driver", "evaluator", "learner", "parameter server", "replay",
                                      "worker 0", "worker 1"]
    for pid in names:
        assert f"pid {pid}" in meta[(pid, "process_labels")]["labels"]
    order = sorted(names, key=lambda pid: meta[(pid, "process_sort_index")]["sort_index"])
    assert [names[p] for p in order] == ["driver", "learner", "replay", "parameter server", "worker 0",
                                         "worker 1", "evaluator"]
    spans = body(obj, ph="X")
    assert all(e["ts"] >= 0 and e["dur"] >= 0 and isinstance(e["args"], dict) for e in spans)
    learner = next(p for p, n in names.items() if n == "learner")
    assert len({e["tid"] for e in body(obj, learner)}) == 2  # the prefetch thread has its own tid
    assert validate_trace(path) == [] and validate_trace(obj) == []


def test_writer_sorts_per_process_and_nests_per_thread(tmp_path):
    tr = T.Tracer("worker", 0, enabled=True)
    t = time.time()
    tr.complete("idle", "wait", t + 0.5, 0.1)  # recorded out of order
    tr.complete("sample", "rollout", t, 0.2)
    tr.complete("env_step", "env", t + 0.15, 0.1)  # outlasts its parent by 50 ms: clipped to fit
    path, obj = write(tmp_path, [as_process(tr.drain(), 20)])
    ts = [e["ts"] for e in body(obj, 20)]
    assert ts == sorted(ts)
    child = next(e for e in body(obj, 20) if e["name"] == "env_step")
    parent = next(e for e in body(obj, 20) if e["name"] == "sample")
    assert child["ts"] + child["dur"] == parent["ts"] + parent["dur"]
    assert obj["otherData"]["spans_clipped"] == 1 and validate_trace(path) == []


def test_a_track_is_a_lane_of_its_own_across_the_threads_spans(tmp_path):
    tr = T.Tracer("driver", enabled=True)
    held = tr.begin("learner_held", "wait", track="rate limiter")
    with tr.span("gather", "wait"):
        pass
    tr.end(held)  # ends after the gather began and ended: on the thread it would not nest
    with tr.span("gather", "wait"):
        pass
    path, obj = write(tmp_path, [as_process(tr.drain(), 10)])
    threads = {e["tid"]: e["args"]["name"] for e in obj["traceEvents"] if e["name"] == "thread_name"}
    by_name = {e["name"]: e["tid"] for e in body(obj, 10, "X")}
    assert threads[by_name["learner_held"]] == "rate limiter" and by_name["learner_held"] != by_name["gather"]
    assert obj["otherData"]["spans_clipped"] == 0 and validate_trace(path) == []


def test_the_writer_counts_what_recording_got_out_of_order(tmp_path):
    tr = T.Tracer("worker", 0, enabled=True)
    t = time.time()
    tr.complete("env_step", "env", t, 0.002)
    tr.complete("env_step", "env", t - 1.0, 0.002)  # ends before the event recorded first: a clock stepped back
    _, obj = write(tmp_path, [as_process(tr.drain(), 20)])
    assert obj["otherData"]["events_out_of_order"] == 1
    for _ in range(2000):  # callers time children with time.time(): their ends round as their parent's do
        with tr.span("sample", "rollout"):
            t0 = time.time()
            tr.complete("env_step", "env", t0, time.time() - t0)
    _, obj = write(tmp_path, [as_process(tr.drain(), 20)])
    assert obj["otherData"]["events_out_of_order"] == obj["otherData"]["spans_clipped"] == 0


def test_size_bound_holds_in_the_file(tmp_path):
    drains = []
    for pid in (20, 21):
        tr = T.Tracer("worker", pid - 20, enabled=True, capacity=50)
        for _ in range(200):
            with tr.span("env_step", "env"):
                pass
        drains.append(as_process(tr.drain(), pid))
    _, obj = write(tmp_path, drains)
    for pid in (20, 21):
        assert len(body(obj, pid)) == 50
    assert obj["otherData"]["dropped"] == {"worker 0": 150, "worker 1": 150}


def test_drains_of_one_process_merge(tmp_path):
    tr = T.Tracer("learner", enabled=True, capacity=3)
    for batch in range(2):
        for _ in range(5):
            tr.complete("update_block", "learning", time.time(), 0.0)
        tr_drain = as_process(tr.drain(), 11)
        if batch == 0:
            first = tr_drain
    path, obj = write(tmp_path, [first, tr_drain])
    assert len(body(obj, 11)) == 6 and obj["otherData"]["dropped"] == {"learner": 4}
    assert validate_trace(path) == []


def test_a_store_of_pulled_drains_keeps_what_each_ring_would_keep():
    """A collector pulls the rings during a run: per process it holds the newest `capacity` events of all
    its pulls, counting the older as dropped, and it keeps a process that answers no more pulls."""
    store = T.TraceStore()
    worker, learner = T.Tracer("worker", 0, enabled=True, capacity=4), T.Tracer("learner", enabled=True, capacity=4)
    learner.instant("before it died", "driver")
    store.add(as_process(learner.drain(), 11))
    for pull in range(3):
        for i in range(3):
            worker.instant(f"e{pull}{i}", "driver")
        store.add(as_process(worker.drain(), 20))
    kept = {d["meta"]["pid"]: d for d in store.drains()}
    assert [e[3] for e in kept[20]["events"]] == ["e12", "e20", "e21", "e22"]
    assert kept[20]["meta"]["dropped"] == 5 and kept[20]["meta"]["capacity"] == 4
    assert [e[3] for e in kept[11]["events"]] == ["before it died"] and kept[11]["meta"]["dropped"] == 0


# --- the checker ---------------------------------------------------------------------------

def good_trace():
    x = {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 100, "name": "sample", "cat": "rollout", "args": {}}
    child = dict(x, ts=10, dur=20, name="env_step", cat="env")
    other = dict(x, pid=2, tid=2, ts=200, dur=50, name="replay_add", cat="replay")
    meta = [{"ph": "M", "pid": pid, "tid": pid, "name": key, "args": {field: value}}
            for pid in (1, 2) for key, field, value in (("process_name", "name", f"p{pid}"),
                                                        ("process_labels", "labels", "node a"),
                                                        ("process_sort_index", "sort_index", pid))]
    flow = [{"ph": "s", "pid": 1, "tid": 1, "ts": 50, "id": 1, "name": "fragment", "cat": "fragment"},
            {"ph": "f", "pid": 2, "tid": 2, "ts": 210, "id": 1, "name": "fragment", "cat": "fragment", "bp": "e"}]
    events = meta + [x, child, flow[0], other, flow[1]]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"start_time": 1.0}}


def broken(change):
    obj = good_trace()
    change(obj)
    return obj


def _event(obj, name, ph="X"):
    return next(e for e in obj["traceEvents"] if e["name"] == name and e["ph"] == ph)


BREAKAGES = {
    "not an object": (lambda o: o.clear(), "no traceEvents"),
    "display unit": (lambda o: o.update(displayTimeUnit="hours"), "displayTimeUnit"),
    "start time": (lambda o: o["otherData"].pop("start_time"), "start_time"),
    "unknown ph": (lambda o: _event(o, "env_step").update(ph="Q"), "known ph"),
    "no pid": (lambda o: _event(o, "env_step").pop("pid"), "integer pid"),
    "no dur": (lambda o: _event(o, "env_step").pop("dur"), "dur >= 0"),
    "negative dur": (lambda o: _event(o, "env_step").update(dur=-5), "dur >= 0"),
    "no cat": (lambda o: _event(o, "env_step").pop("cat"), "a cat"),
    "no ts": (lambda o: _event(o, "env_step").update(ts="soon"), "numeric ts"),
    "flow end unbound": (lambda o: _event(o, "fragment", "f").pop("bp"), "bp 'e'"),
    "no process name": (lambda o: o["traceEvents"].remove(_event(o, "process_name", "M")), "no process_name"),
    "no sort index": (lambda o: o["traceEvents"].remove(_event(o, "process_sort_index", "M")),
                      "no process_sort_index"),
    "backwards": (lambda o: _event(o, "env_step").update(ts=-1, dur=0), "backwards"),
    "overlap": (lambda o: _event(o, "env_step").update(dur=500), "without nesting"),
    "unpaired flow": (lambda o: o["traceEvents"].remove(_event(o, "fragment", "f")), "not one start and one end"),
    "flow outside spans": (lambda o: _event(o, "fragment", "s").update(ts=150), "lies in no span"),
}


def test_the_good_trace_is_good():
    assert validate_trace(good_trace()) == []


@pytest.mark.parametrize("kind", sorted(BREAKAGES))
def test_validate_catches(kind):
    change, message = BREAKAGES[kind]
    problems = validate_trace(broken(change))
    assert any(message in p for p in problems), (kind, problems)


def test_validate_reads_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "cannot read" in validate_trace(str(bad))[0]
    assert validate_trace([1, 2]) == ["the trace is not a JSON object"]
