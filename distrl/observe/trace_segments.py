"""A run's trace.json across resumes: each segment's events appended to the earlier segments'.

`distrl resume` continues the run's clock (wall time counts on from the checkpoint, as in
metrics.csv's `wall_s`), so every segment's events lie on one time axis. What an earlier segment
recorded after the checkpoint a later segment resumed from, the later one did again: like
metrics.csv's rows, those events are cut (a span running across the checkpoint ends there, marked
`cut_at_resume`), so no lane holds two segments' events at once. `otherData` gains:

* `segments`: per segment, `start_time` (the Unix time of 0 s on that segment's clock: an event at
  `ts` of the segment happened at `start_time + ts / 1e6`), `from_s` (the run time it resumed at,
  0 for the first) and the segment's mode, algorithm and env;
* `events_cut_at_resume`, `spans_cut_at_resume`: what the cut removed (a flow loses both halves when
  either is cut) and how many spans it shortened;
* `resumes_seen`: the lines of resumes.jsonl when the file was written (the later resumes are the
  ones whose checkpoints cut it).

The repair counters of `distrl.observe.trace.build_trace` are summed over the segments. A process of
an earlier segment whose pid a later process reuses shares its lane when both have the same name (an
in-process resume's driver is one process), and is renumbered above any real pid otherwise.
"""
from __future__ import annotations

import json
import os

from distrl.observe.trace import build_trace, dump_trace, order_key

TRACE, RESUMES = "trace.json", "resumes.jsonl"
PID_SPACE = 1 << 22  # Linux's largest pid_max: a pid renumbered above it is no real process's
FLOWS = ("s", "f")
SUMMED = ("events_out_of_order", "spans_clipped", "flow_halves_unbound", "flow_ends_orphaned", "flow_halves_dropped",
          "events_cut_at_resume", "spans_cut_at_resume")


def resume_points(run_dir: str) -> list[float]:
    """The run time each resume of the run started from (resumes.jsonl's `resumed_at_wall_s`), in order."""
    try:
        with open(os.path.join(run_dir, RESUMES)) as fh:
            lines = [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError):
        return []
    return [float(x.get("resumed_at_wall_s") or 0.0) for x in lines if isinstance(x, dict)]


def _read(path: str) -> tuple[dict | None, str | None]:
    """(the trace at `path`, or None; why an existing file could not be used)."""
    if not os.path.isfile(path):
        return None, None
    try:
        with open(path) as fh:
            obj = json.load(fh)
    except (OSError, ValueError) as e:
        return None, f"unreadable: {e}"
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list) \
            or not isinstance(obj.get("otherData"), dict):
        return None, "not a trace-event file with otherData"
    return obj, None


def write_run_trace(run_dir: str, drained: list[dict], start_time: float, extra: dict | None = None) -> None:
    """RUN_DIR/trace.json of this segment's drains, after the earlier segments' trace when it resumed."""
    path, resumes = os.path.join(run_dir, TRACE), resume_points(run_dir)
    obj = build_trace(drained, start_time, extra)
    other = obj["otherData"]
    other.update(events_cut_at_resume=0, spans_cut_at_resume=0, resumes_seen=len(resumes),
                 segments=[{"start_time": start_time, "from_s": resumes[-1] if resumes else 0.0, **(extra or {})}])
    earlier, problem = _read(path)
    since = resumes[int(earlier["otherData"].get("resumes_seen", 0)):] if earlier else []
    if since:  # a file this segment's own resume would not have left is replaced, not appended to
        obj = append_segment(earlier, obj, min(since))
    elif problem:
        other["earlier_trace"] = problem  # a trace.json no writer of this version left; replaced
    dump_trace(path, obj)


def append_segment(earlier: dict, new: dict, cut_s: float) -> dict:
    """One trace: `earlier`'s events cut at `cut_s` (run seconds), then `new`'s."""
    kept, cut = _cut(earlier["traceEvents"], round(cut_s * 1e6))
    kept = _apart(kept, new["traceEvents"])
    events = _per_process(kept + new["traceEvents"], {ev["pid"] for ev in new["traceEvents"]})
    return {"traceEvents": events, "displayTimeUnit": new.get("displayTimeUnit", "ms"),
            "otherData": _other(earlier["otherData"], new["otherData"], cut)}


def _cut(events: list[dict], cut_us: int) -> tuple[list[dict], dict]:
    """Events before `cut_us`; a span across it ends there; a flow whose either half is at or after it goes."""
    late_flows = {ev["id"] for ev in events if ev.get("ph") in FLOWS and ev["ts"] >= cut_us}
    out, cut, shortened = [], 0, 0
    for ev in events:
        if ev.get("ph") == "M":
            out.append(ev)
        elif ev["ts"] >= cut_us or (ev["ph"] in FLOWS and ev["id"] in late_flows):
            cut += 1
        elif ev["ph"] == "X" and ev["ts"] + ev["dur"] > cut_us:
            out.append(dict(ev, dur=cut_us - ev["ts"], args={**(ev.get("args") or {}), "cut_at_resume": True}))
            shortened += 1
        else:
            out.append(ev)
    return out, {"events_cut_at_resume": cut, "spans_cut_at_resume": shortened}


def _names(events: list[dict]) -> dict[int, str]:
    return {ev["pid"]: ev["args"].get("name") for ev in events if ev.get("ph") == "M" and ev["name"] == "process_name"}


def _apart(kept: list[dict], new: list[dict]) -> list[dict]:
    """`kept` with its flow ids above `new`'s, and its pids apart from `new`'s unless they name the same process."""
    old_names, new_names = _names(kept), _names(new)
    used = {ev["pid"] for ev in kept} | {ev["pid"] for ev in new}
    remap = {}
    for pid in sorted({ev["pid"] for ev in kept} & {ev["pid"] for ev in new}):
        if old_names.get(pid) != new_names.get(pid):
            fresh = pid % PID_SPACE + PID_SPACE
            while fresh in used:
                fresh += PID_SPACE
            remap[pid] = fresh
            used.add(fresh)
    offset = max((ev["id"] for ev in new if ev.get("ph") in FLOWS), default=0)
    out = []
    for ev in kept:
        if ev["pid"] in remap:  # the main thread's tid is its pid: it moves with it
            ev = dict(ev, pid=remap[ev["pid"]], tid=remap[ev["pid"]] if ev.get("tid") == ev["pid"] else ev.get("tid"))
        if ev.get("ph") in FLOWS:
            ev = dict(ev, id=ev["id"] + offset)
        out.append(ev)
    return out


def _per_process(events: list[dict], new_pids: set) -> list[dict]:
    """Each process's metadata (a later segment's replacing an earlier one's), then its events in time
    order; a process of an earlier segment with nothing left after the cut is left out."""
    heads: dict[int, dict] = {}
    bodies: dict[int, list] = {}
    for ev in events:
        if ev.get("ph") == "M":
            heads.setdefault(ev["pid"], {})[(ev["name"], ev.get("tid"))] = ev
        else:
            bodies.setdefault(ev["pid"], []).append(ev)
    pids = [pid for pid in heads if pid in bodies or pid in new_pids]
    pids += [pid for pid in bodies if pid not in heads]
    return [ev for pid in pids for ev in [*heads.get(pid, {}).values(), *sorted(bodies.get(pid, []), key=order_key)]]


def _other(old: dict, new: dict, cut: dict) -> dict:
    out = dict(new)
    out["start_time"] = old.get("start_time", new["start_time"])  # the run's first segment
    for key in SUMMED:
        out[key] = int(old.get(key) or 0) + int(new.get(key) or 0) + cut.get(key, 0)
    for key in ("dropped", "flow_starts_unconsumed"):
        merged = dict(old.get(key) or {})
        for name, n in (new.get(key) or {}).items():
            merged[name] = merged.get(name, 0) + n
        out[key] = merged
    first = {"start_time": old.get("start_time"), "from_s": 0.0,
             **{k: old[k] for k in ("mode", "algo", "env") if k in old}}
    out["segments"] = list(old.get("segments") or [first]) + list(new.get("segments") or [])
    return out
