"""`validate_trace`: what a trace.json must be for viewers, `distrl timeline` and `distrl report`.

It checks the written file: the trace-event format, the metadata every process needs, time running
forward per process, spans nesting per thread and flows paired and bound to a span. The writer
(`distrl.observe.trace.write_trace`) repairs what recording got wrong and counts each repair in
`otherData`, so a test of real recording asserts on those counters as well as on this check.
"""
from __future__ import annotations

import json
import os

from distrl.observe.trace import bound_halves

MAX_PROBLEMS = 50  # validate_trace stops listing after this many: one broken writer floods otherwise


def _check_top(obj) -> list[str]:
    if not isinstance(obj, dict):
        return ["the trace is not a JSON object"]
    other = obj.get("otherData")
    return [problem for ok, problem in (
        (isinstance(obj.get("traceEvents"), list), "no traceEvents list"),
        (obj.get("displayTimeUnit") in ("ms", "ns"), "displayTimeUnit is not 'ms' or 'ns'"),
        (isinstance(other, dict) and isinstance(other.get("start_time"), (int, float)),
         "otherData has no numeric start_time")) if not ok]


def _check_event(i: int, ev) -> str | None:
    if not isinstance(ev, dict) or ev.get("ph") not in ("X", "M", "s", "f", "i"):
        return f"event {i} is not an object with a known ph (X, M, s, f, i)"
    ph, num = ev["ph"], (int, float)
    checks = ((isinstance(ev.get("pid"), int) and isinstance(ev.get("tid"), int), "an integer pid and tid"),
              (isinstance(ev.get("name"), str), "a name"),
              (ph != "M" or isinstance(ev.get("args"), dict), "args"),
              (ph == "M" or isinstance(ev.get("ts"), num), "a numeric ts"),
              (ph == "M" or isinstance(ev.get("cat"), str), "a cat"),
              (ph != "X" or isinstance(ev.get("dur"), num) and ev["dur"] >= 0, "a dur >= 0"),
              (ph not in ("s", "f") or "id" in ev, "an id"),
              (ph != "f" or ev.get("bp") == "e", "bp 'e' (binding to its enclosing slice)"))
    lacking = [what for ok, what in checks if not ok]
    return f"event {i} ({ph} {ev.get('name')!r}) lacks {', '.join(lacking)}" if lacking else None


def _check_metadata(events: list[dict]) -> list[str]:
    needed = ("process_name", "process_labels", "process_sort_index")
    have: dict[int, set] = {}
    for ev in events:
        if ev["ph"] == "M":
            have.setdefault(ev["pid"], set()).add(ev["name"])
    pids = {ev["pid"] for ev in events if ev["ph"] != "M"} | set(have)
    return [f"process {pid} has no {name} metadata" for pid in sorted(pids) for name in needed
            if name not in have.get(pid, set())]


def _check_order(events: list[dict]) -> list[str]:
    last, problems = {}, []
    for ev in events:
        if ev["ph"] == "M":
            continue
        if ev["ts"] < last.get(ev["pid"], float("-inf")):
            problems.append(f"process {ev['pid']}: timestamps go backwards at {ev['name']} (ts {ev['ts']})")
        last[ev["pid"]] = max(ev["ts"], last.get(ev["pid"], float("-inf")))
    return problems


def _check_nesting(events: list[dict]) -> list[str]:
    problems, stacks = [], {}
    for ev in sorted((e for e in events if e["ph"] == "X"), key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"])):
        stack = stacks.setdefault((ev["pid"], ev["tid"]), [])
        while stack and stack[-1][0] <= ev["ts"]:
            stack.pop()
        if stack and ev["ts"] + ev["dur"] > stack[-1][0]:
            problems.append(f"process {ev['pid']} thread {ev['tid']}: span {ev['name']} at {ev['ts']} "
                            f"overlaps {stack[-1][1]} without nesting inside it")
        stack.append((ev["ts"] + ev["dur"], ev["name"]))
    return problems


def _check_flows(events: list[dict]) -> list[str]:
    halves = [e for e in events if e["ph"] in ("s", "f")]
    problems, by_id = [], {}
    for h in halves:
        by_id.setdefault(h["id"], []).append(h["ph"])
    for flow_id, phs in by_id.items():
        if sorted(phs) != ["f", "s"]:
            problems.append(f"flow {flow_id} is not one start and one end (has {sorted(phs)})")
    spans = [e for e in events if e["ph"] == "X"]
    bound = {id(h) for h in bound_halves(halves, spans)}
    problems += [f"flow {h['id']} {h['ph']} at {h['ts']} lies in no span of process {h['pid']} thread {h['tid']}"
                 for h in halves if id(h) not in bound]
    return problems


def validate_trace(path_or_obj) -> list[str]:
    """Problems with a trace (a path or the loaded object); [] when it is well formed."""
    obj = path_or_obj
    if isinstance(path_or_obj, (str, os.PathLike)):
        try:
            with open(path_or_obj) as fh:
                obj = json.load(fh)
        except (OSError, ValueError) as e:
            return [f"cannot read {path_or_obj}: {e}"]
    problems = _check_top(obj)
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        return problems
    found = [(ev, _check_event(i, ev)) for i, ev in enumerate(obj["traceEvents"])]
    problems += [bad for _, bad in found if bad]
    events = [ev for ev, bad in found if not bad]
    for check in (_check_metadata, _check_order, _check_nesting, _check_flows):
        problems += check(events)
    return problems[:MAX_PROBLEMS]
