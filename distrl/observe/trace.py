"""What every process does, over time: a cheap per-process recorder and the trace.json writer.

Each process owns one `Tracer` (`configure` / `tracer`); recording appends a small tuple
(ph, ts_us, dur_us, name, cat or flow id, thread, args) to a bounded ring, so a long run keeps its
newest events and counts the lost ones. The driver collects every process's `drain()` (plain Python:
it travels through Ray, which this module never imports; `TraceStore` keeps drains pulled during a
run, bounded as the rings are) and `write_trace` makes one Chrome trace-event file (Perfetto,
chrome://tracing), timed from the run's start. The writer repairs what recording got wrong
(overlapping spans, unpaired flows) and counts every repair in `otherData`;
`distrl.observe.trace_check.validate_trace` checks the result. A resumed run's file keeps the
earlier segments' events (`distrl.observe.trace_segments`).
"""
from __future__ import annotations

import collections
import itertools
import json
import os
import re
import socket
import threading
import time

ROLE_ALIASES = {"ps": "parameter server", "param server": "parameter server", "params": "parameter server"}
# Lane order in viewers: driver/main, learner, replay, parameter server, inference server, workers by index,
# evaluator, then the rest (gradient workers).
ROLE_ORDER = {"driver": 0, "main": 0, "learner": 1, "replay": 2, "parameter server": 3, "inference": 4, "worker": 5,
              "evaluator": 6}


def _now_us() -> int:
    # Wall clock, so processes on one host (and NTP-synced hosts) line up. The same float clock and
    # rounding as `complete()` (which callers time with time.time()), so a child never ends a
    # microsecond after its parent by rounding alone.
    return int(time.time() * 1e6)


class _NoSpan:
    """The shared span of a disabled tracer: entering and leaving it costs two method calls."""
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def set(self, **args) -> None:
        pass


_NO_SPAN = _NoSpan()


class _Span:
    """A complete event timed around a `with` block; `set(**args)` adds args known only at the end."""
    __slots__ = ("_args", "_cat", "_name", "_t0", "_tracer")

    def __init__(self, tracer: Tracer, name: str, cat: str, args: dict):
        self._tracer, self._name, self._cat, self._args = tracer, name, cat, args

    def __enter__(self):
        self._t0 = _now_us()
        return self

    def set(self, **args) -> None:
        self._args.update(args)

    def __exit__(self, *exc) -> bool:
        t0 = self._t0
        self._tracer._push(("X", t0, _now_us() - t0, self._name, self._cat, threading.get_ident(),
                            self._args or None))
        return False


class Tracer:
    """One process's recorder. Every method returns at once when `enabled` is False."""

    def __init__(self, role: str = "main", index: int | None = None, enabled: bool = False,
                 capacity: int = 100_000, node: str | None = None):
        self.role, self.index, self.enabled = role, index, enabled
        self.capacity = max(1, int(capacity))
        # `node`: the Ray node id when the process runs under Ray (several Ray nodes can share one
        # host); the host name is recorded always, so a machine is recognisable in every mode.
        self.node, self.host = node, socket.gethostname()
        self.dropped = 0
        self._ring: collections.deque = collections.deque(maxlen=self.capacity)
        self._open: dict[int, tuple] = {}  # begin() tokens not yet ended
        self._tokens = itertools.count(1)

    def _push(self, event: tuple) -> None:
        # The deque evicts the oldest by itself; the count is racy across threads, which only
        # makes `dropped` approximate, never the ring unbounded.
        if len(self._ring) == self.capacity:
            self.dropped += 1
        self._ring.append(event)

    def span(self, name: str, cat: str, **args):
        return _Span(self, name, cat, args) if self.enabled else _NO_SPAN

    def begin(self, name: str, cat: str, track: str | None = None) -> int | None:
        """Open a span that `end(token)` closes. `track` names a lane of its own in this process, for
        a state that outlasts what the thread does meanwhile (spans on a thread must nest)."""
        if not self.enabled:
            return None
        if len(self._open) >= self.capacity:  # ends that never come must not grow memory forever
            self._open.pop(next(iter(self._open)))
            self.dropped += 1
        token = next(self._tokens)
        self._open[token] = (name, cat, _now_us(), track or threading.get_ident())
        return token

    def end(self, token, **args) -> None:
        opened = self._open.pop(token, None) if token is not None else None
        if opened is not None and self.enabled:
            name, cat, t0, thread = opened
            self._push(("X", t0, _now_us() - t0, name, cat, thread, args or None))

    def complete(self, name: str, cat: str, start_s: float, dur_s: float, **args) -> None:
        """A span timed by the caller: `start_s` from time.time(), `dur_s` in seconds."""
        if self.enabled:
            ts = int(start_s * 1e6)  # the end rounded as _now_us() would round it then
            self._push(("X", ts, max(0, int((start_s + dur_s) * 1e6) - ts), name, cat,
                        threading.get_ident(), args or None))

    def instant(self, name: str, cat: str, **args) -> None:
        if self.enabled:
            self._push(("i", _now_us(), 0, name, cat, threading.get_ident(), args or None))

    def flow_out(self, flow: str, flow_id: int) -> None:
        if self.enabled:
            self._push(("s", _now_us(), 0, flow, flow_id, threading.get_ident(), None))

    def flow_in(self, flow: str, flow_id: int) -> None:
        if self.enabled:
            self._push(("f", _now_us(), 0, flow, flow_id, threading.get_ident(), None))

    def drain(self) -> dict:
        """Everything recorded since the last drain, and how many events the ring lost meanwhile."""
        # Swap rings rather than copy-and-clear, so an event appended meanwhile by another
        # thread lands in one drain or the next, never in neither.
        ring, self._ring = self._ring, collections.deque(maxlen=self.capacity)
        events, (dropped, self.dropped) = list(ring), (self.dropped, 0)
        live = {t.ident: (t.native_id, t.name) for t in threading.enumerate()}
        live.update({e[5]: (None, e[5]) for e in events if isinstance(e[5], str)})  # begin(track=...)
        threads = {e[5]: live[e[5]] for e in events if e[5] in live}
        meta = {"role": self.role, "index": self.index, "pid": os.getpid(), "node": self.node, "host": self.host,
                "dropped": dropped, "capacity": self.capacity, "threads": threads}
        return {"meta": meta, "events": events}


_TRACER = Tracer()


def configure(role: str, index: int | None = None, enabled: bool = True, capacity: int = 100_000,
              node: str | None = None) -> Tracer:
    """Give this process its tracer (called once by each role at start-up)."""
    global _TRACER
    _TRACER = Tracer(role, index, enabled, capacity, node)
    return _TRACER


def tracer() -> Tracer:
    """This process's tracer: a disabled one until `configure` enables it."""
    return _TRACER


# --- the file ---------------------------------------------------------------------------------

def process_name(role: str, index: int | None) -> str:
    role = str(role).strip().lower().replace("_", " ")
    role = ROLE_ALIASES.get(role, role)
    return role if index is None else f"{role} {index}"


def split_name(name: str) -> tuple[str, int | None]:
    """"worker 3" -> ("worker", 3); "parameter server" -> ("parameter server", None)."""
    m = re.fullmatch(r"(.*?) (\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, None)


def _sort_index(role: str, index: int | None) -> int:
    return ROLE_ORDER.get(role, 7) * 100_000 + (index or 0)


class TraceStore:
    """Drains of many processes, several per process, merged per process. `bounded`: kept as the rings
    keep them, each process's newest `capacity` events, the evicted ones counted as dropped, so a
    collector that pulls the rings all run long holds no more than the rings do (and keeps what a
    process recorded up to the last pull, should the process die later)."""

    def __init__(self, bounded: bool = True):
        self.bounded = bounded
        self._procs: dict[int, dict] = {}

    def add(self, drained: dict) -> None:
        meta = drained["meta"]
        proc = self._procs.get(meta["pid"])
        if proc is None:
            capacity = meta.get("capacity") if self.bounded else None
            ring = collections.deque(maxlen=max(1, int(capacity)) if capacity else None)
            proc = self._procs[meta["pid"]] = {"meta": dict(meta, dropped=0, threads={}), "events": ring}
        ring = proc["events"]
        evicted = max(0, len(ring) + len(drained["events"]) - ring.maxlen) if ring.maxlen else 0
        proc["meta"]["dropped"] += meta.get("dropped", 0) + evicted
        proc["meta"]["threads"].update(meta.get("threads") or {})
        ring.extend(drained["events"])

    def drains(self) -> list[dict]:
        return [{"meta": proc["meta"], "events": list(proc["events"])} for proc in self._procs.values()]


def _thread_ids(pid: int, meta: dict, events: list) -> dict:
    """Recorded thread ident -> (tid, name). The OS thread id when known (main thread = pid)."""
    out, spare = {}, itertools.count(1)
    for ident in dict.fromkeys(e[5] for e in events):
        native, name = meta["threads"].get(ident, (None, None))
        out[ident] = (native if native else pid * 1000 + next(spare), name or f"thread {len(out)}")
    return out


def _nest(spans: list[dict]) -> int:
    """Clip spans that outlast their parent on the same thread; how many were clipped (0 when recording
    is right: a thread's spans nest by construction, and every stamp comes from one clock)."""
    clipped, stacks = 0, {}
    for ev in sorted(spans, key=lambda e: (e["tid"], e["ts"], -e["dur"])):
        stack = stacks.setdefault(ev["tid"], [])
        while stack and stack[-1] <= ev["ts"]:
            stack.pop()
        if stack and ev["ts"] + ev["dur"] > stack[-1]:
            ev["dur"], clipped = stack[-1] - ev["ts"], clipped + 1
        stack.append(ev["ts"] + ev["dur"])
    return clipped


def _out_of_order(events: list[tuple]) -> int:
    """Events that end before an event their thread recorded earlier. A thread records each event when
    it ends, so this is 0 unless the wall clock stepped back or a caller timed a span wrongly."""
    last, late = {}, 0
    for ph, ts, dur, _, _, thread, _ in events:
        end = ts + dur
        late += end < last.get(thread, end)
        last[thread] = max(end, last.get(thread, end))
    return late


def bound_halves(halves: list[dict], spans: list[dict]) -> list[dict]:
    """Flow halves that lie inside a span on their thread (the slice they bind to)."""
    out, stacks = [], {}
    items = sorted([(e["tid"], e["ts"], 0, e) for e in spans] + [(h["tid"], h["ts"], 1, h) for h in halves],
                   key=lambda t: (t[0], t[1], t[2], -t[3].get("dur", 0)))
    for tid, ts, kind, ev in items:
        stack = stacks.setdefault(tid, [])
        while stack and stack[-1] < ts:
            stack.pop()
        if kind == 0:
            stack.append(ts + ev["dur"])
        elif stack:
            out.append(ev)
    return out


def _pair_flows(halves: list[dict]) -> tuple[list[dict], dict[str, int], int]:
    """(paired events, starts no consumer took per flow kind, ends whose producer is not in the trace).
    Each consumer gets its producer (the newest one not after it) under a fresh id, so one publish
    pulled by many workers draws an arrow to each of them."""
    by_key: dict[tuple, dict] = {}
    for h in halves:
        by_key.setdefault((h["cat"], h["id"]), {"s": [], "f": []})[h["ph"]].append(h)
    out, ids, unconsumed, orphans = [], itertools.count(1), {}, 0
    for (cat, _), group in by_key.items():
        outs = sorted(group["s"], key=lambda h: h["ts"])
        if not outs:
            orphans += len(group["f"])
            continue
        taken = set()
        for f in group["f"]:
            earlier = [s for s in outs if s["ts"] <= f["ts"]]
            s = earlier[-1] if earlier else outs[0]
            taken.add(id(s))
            flow_id = next(ids)
            out += [dict(s, id=flow_id), dict(f, id=flow_id, bp="e")]
        if len(outs) > len(taken):
            unconsumed[cat] = unconsumed.get(cat, 0) + len(outs) - len(taken)
    return out, unconsumed, orphans


def _labels(meta: dict, pid: int) -> str:
    node = f"node {meta['node']}, " if meta.get("node") else ""
    return f"{node}host {meta.get('host') or 'unknown'}, pid {pid}"


def _process_events(pid: int, proc: dict, origin: int) -> tuple[list, list, list, dict]:
    """(metadata, spans and instants, bound flow halves, repair counts) of one process, ts from origin."""
    meta, events = proc["meta"], proc["events"]
    name = process_name(meta["role"], meta.get("index"))
    role, index = split_name(name)
    tids = _thread_ids(pid, meta, events)
    head = [{"ph": "M", "pid": pid, "tid": pid, "name": key, "args": {field: value}} for key, field, value in (
        ("process_name", "name", name), ("process_labels", "labels", _labels(meta, pid)),
        ("process_sort_index", "sort_index", _sort_index(role, index)))]
    head += [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": tname}}
             for tid, tname in tids.values()]
    body, halves = [], []
    for ph, ts, dur, a, b, ident, args in events:
        base = {"ph": ph, "pid": pid, "tid": tids[ident][0], "ts": ts - origin}
        if ph in ("s", "f"):
            halves.append(dict(base, name=a, cat=a, id=b))
        else:
            ev = dict(base, name=a, cat=b, args=args or {})
            if ph == "X":
                ev["dur"] = dur
            else:
                ev["s"] = "t"  # an instant scoped to its thread
            body.append(ev)
    spans = [e for e in body if e["ph"] == "X"]
    repairs = {"events_out_of_order": _out_of_order(events), "spans_clipped": _nest(spans)}
    bound = bound_halves(halves, spans)
    repairs["flow_halves_unbound"] = len(halves) - len(bound)
    return head, body, bound, repairs


def order_key(ev: dict) -> tuple:
    # Parents before children at one ts; flow halves after the span they bind to.
    return ev["ts"], 0 if ev["ph"] == "X" else 1, -ev.get("dur", 0)


def _json_default(obj):
    return obj.item() if hasattr(obj, "item") else str(obj)  # numpy scalars in span args


def build_trace(drained: list[dict], start_time: float, extra: dict | None = None) -> dict:
    """The trace-event object of the processes' drains (several drains of one process are merged).

    `otherData` counts what the file lacks or the writer changed: `dropped` (per process, events its
    ring evicted), `events_out_of_order`, `spans_clipped`, `flow_halves_unbound` (a flow half in no
    span of its thread), `flow_ends_orphaned` (a consumer whose producer is not in the trace),
    `flow_starts_unconsumed` (per flow kind: a fragment still in flight at the end, a publish no one
    pulled) and `flow_halves_dropped`, every half not drawn."""
    origin = round(start_time * 1e6)
    heads, bodies, halves, dropped = {}, {}, [], {}
    repairs = dict.fromkeys(("events_out_of_order", "spans_clipped", "flow_halves_unbound"), 0)
    store = TraceStore(bounded=False)  # the drains' collector bounded them, if it pulled more than once
    for d in drained:
        store.add(d)
    for proc in sorted(store.drains(), key=lambda p: p["meta"]["pid"]):
        pid = proc["meta"]["pid"]
        heads[pid], bodies[pid], bound, counts = _process_events(pid, proc, origin)
        halves += bound
        repairs = {k: v + counts[k] for k, v in repairs.items()}
        name = heads[pid][0]["args"]["name"]
        dropped[name] = dropped.get(name, 0) + proc["meta"]["dropped"]
    flows, unconsumed, orphans = _pair_flows(halves)
    for ev in flows:
        bodies[ev["pid"]].append(ev)
    events = [ev for pid, head in heads.items() for ev in head + sorted(bodies[pid], key=order_key)]
    lost = repairs["flow_halves_unbound"] + orphans + sum(unconsumed.values())
    other = {"start_time": start_time, "dropped": dropped, **repairs, "flow_ends_orphaned": orphans,
             "flow_starts_unconsumed": unconsumed, "flow_halves_dropped": lost, **(extra or {})}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def dump_trace(path: str, obj: dict) -> None:
    """Write a trace object as JSON, atomically: a reader never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, default=_json_default, separators=(",", ":"))
    os.replace(tmp, path)


def write_trace(path: str, drained: list[dict], start_time: float, extra: dict | None = None) -> None:
    """Merge the processes' drains into one trace-event JSON file at `path` (see `build_trace`)."""
    dump_trace(path, build_trace(drained, start_time, extra))
