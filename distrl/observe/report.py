"""`distrl report`: where a traced run's time went, and which side held it back.

The window is the training loop (to the driver's last gather) unless --from/--to say otherwise.
Shares per process, over its own lane (first span to the window's end, or to its last span if a
replacement process took over): busy = its top-level spans that are
not `wait`, waiting = top-level `wait` spans, idle = the rest (untraced gaps). Threads of one
process are merged as a union, so a prefetch thread never pushes a share past 100%.

Fragments in flight: each fragment flow's time from producer to consumer (`in_flight`).

The bottleneck rule compares busy shares, not waits: a wait the runtime forgot to record shows up
as idle, which is still "not busy", so the verdict does not hinge on complete instrumentation.
  * single mode (a `main` lane and no learner lane): the main process's time in top-level
    `learning` spans against top-level `rollout` spans; one at least RATIO_SINGLE times the
    other names the bottleneck (learner- or sampling-bound), else balanced.
  * distributed: L = the learner's busy share, W = the mean over workers.
      - neither reaches SATURATED: "replay-bound" when the replay server is busier than both and
        saturated, else "overhead-bound" (time goes to coordination, transfers, the driver);
      - L - W >= MARGIN: learner-bound; W - L >= MARGIN: sampling-bound, or replay-bound when
        the replay server is busier than the workers and saturated; otherwise balanced.
  * no learner lane, or no worker lane: undetermined.
"""
from __future__ import annotations

import csv
import json
import math
import os

import numpy as np

from distrl.observe.timeline import Trace, read_trace, resolve_window, resumed_at

CATEGORIES = ["env", "inference", "rollout", "transfer", "learning", "replay", "evaluation", "checkpoint",
              "driver", "wait"]
SATURATED = 0.5  # a side busy less than half its time is not what holds the run back
MARGIN = 0.15  # busy shares closer than this call the run balanced
RATIO_SINGLE = 1.25


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(zip(starts.tolist(), ends.tolist())):
        if cur_e is None or s > cur_e:
            total += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (0.0 if cur_e is None else cur_e - cur_s)


def _top_spans(trace: Trace, pid: int, a: float, b: float):
    """(start, end, cat) arrays of the process's top-level spans, clipped to the window."""
    starts, ends, cats = [], [], []
    for ln in trace.lanes:
        if ln.pid == pid:
            keep = (ln.depth == 0) & (ln.end > a) & (ln.start < b)
            starts.append(np.clip(ln.start[keep], a, b))
            ends.append(np.clip(ln.end[keep], a, b))
            cats += [c for c, k in zip(ln.cat, keep) if k]
    return np.concatenate(starts), np.concatenate(ends), np.array(cats, dtype=object)


def process_shares(trace: Trace, a: float, b: float) -> list[dict]:
    """Busy / waiting / idle shares of every process's lane wall time within [a, b]."""
    out = []
    spans = {pid: _top_spans(trace, pid, a, b) for pid in dict.fromkeys(ln.pid for ln in trace.lanes)}
    label = {ln.pid: ln.process for ln in trace.lanes}
    # A process lives until the window's end unless a replacement (same label, later start) took over:
    # a learner that only published once is idle, not 100% busy over a zero-length lane.
    latest = {}
    for pid, (s, _, _) in spans.items():
        if len(s) and (label[pid] not in latest or s.min() > spans[latest[label[pid]]][0].min()):
            latest[label[pid]] = pid
    for pid, (s, e, cats) in spans.items():
        if not len(s):
            continue
        end = b if latest[label[pid]] == pid else float(e.max())
        wall = max(end - float(s.min()), 1e-9)
        work = cats != "wait"
        busy = _union_length(s[work], e[work])
        waiting = _union_length(s, e) - busy  # wait time not overlapped by another thread's work
        lane = next(ln for ln in trace.lanes if ln.pid == pid)
        out.append({"process": lane.process, "role": lane.role, "pid": pid, "wall_s": round(wall, 3),
                    "busy": round(busy / wall, 4), "waiting": round(waiting / wall, 4),
                    "idle": round(max(0.0, 1 - (busy + waiting) / wall), 4),
                    "top_s": {c: round(float((e[cats == c] - s[cats == c]).sum()), 4) for c in set(cats.tolist())}})
    return out


def role_breakdown(trace: Trace, a: float, b: float) -> dict[str, dict[str, float]]:
    """Seconds of self time (children excluded) per category, summed over the processes of a role."""
    out: dict[str, dict[str, float]] = {}
    for ln in trace.lanes:
        overlap = np.clip(np.minimum(ln.end, b) - np.maximum(ln.start, a), 0.0, None)
        dur = np.maximum(ln.end - ln.start, 1e-12)
        share = np.where(ln.end > ln.start, overlap / dur, (ln.start >= a) & (ln.start < b))
        row = out.setdefault(ln.role, {})
        for cat, sec in zip(ln.cat, (ln.self_s * share).tolist()):
            row[cat] = row.get(cat, 0.0) + sec
    return {role: {c: round(v, 4) for c, v in sorted(row.items(), key=lambda kv: _cat_rank(kv[0]))}
            for role, row in out.items()}


def in_flight(trace: Trace, a: float, b: float, kind: str = "fragment") -> dict | None:
    """Milliseconds from each flow's producer to its consumer, for the consumers within [a, b]. For a
    fragment: from the end of the worker's `sample` to the start of the replay server's `replay_add`, i.e.
    Ray storing the returned fragment, the driver's gather taking it, the add call waiting at the replay
    server and Ray resolving its argument. No role's code runs meanwhile, so this is a fragment's
    transfer as the trace can time it honestly: as one interval, not per part."""
    ms = np.array([(t_in - t_out) * 1e3 for flow, t_out, _, t_in, _ in trace.flows if flow == kind and a <= t_in <= b])
    if not len(ms):
        return None
    return {"n": int(len(ms)), "median_ms": round(float(np.median(ms)), 3),
            "p90_ms": round(float(np.percentile(ms, 90)), 3), "max_ms": round(float(ms.max()), 3)}


def _cat_rank(cat: str) -> int:
    return CATEGORIES.index(cat) if cat in CATEGORIES else len(CATEGORIES)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _single_verdict(main: dict) -> tuple[str, str]:
    wall = main["wall_s"]
    learn, sample = main["top_s"].get("learning", 0.0) / wall, main["top_s"].get("rollout", 0.0) / wall
    evidence = f"the main process spends {_pct(learn)} of its time learning and {_pct(sample)} sampling"
    if learn >= RATIO_SINGLE * sample and learn > 0:
        return "learner-bound", evidence
    if sample >= RATIO_SINGLE * learn and sample > 0:
        return "sampling-bound", evidence
    return "balanced", evidence


def _distributed_verdict(learner: dict, workers: list[dict], replay: dict | None,
                         server: dict | None = None) -> tuple[str, str]:
    lb, wb = learner["busy"], float(np.mean([w["busy"] for w in workers]))
    rb = replay["busy"] if replay else 0.0
    if server is not None and server["busy"] >= SATURATED and server["busy"] > lb:
        return "inference-bound", (f"the inference server is busy {_pct(server['busy'])}, the learner {_pct(lb)}; "
                                   f"workers wait on it for their actions")
    if max(lb, wb) < SATURATED:
        if rb >= SATURATED and rb > max(lb, wb):
            return "replay-bound", (f"the replay server is busy {_pct(rb)}, the learner {_pct(lb)}, "
                                    f"workers {_pct(wb)}")
        return "overhead-bound", (f"neither side is saturated: the learner is busy {_pct(lb)}, workers {_pct(wb)}; "
                                  "the rest goes to coordination and transfers")
    if lb - wb >= MARGIN:
        return "learner-bound", f"the learner is busy {_pct(lb)}, workers wait {_pct(1 - wb)} of their time"
    if wb - lb >= MARGIN:
        if rb >= SATURATED and rb > wb:
            return "replay-bound", (f"the replay server is busy {_pct(rb)}, the learner waits "
                                    f"{_pct(1 - lb)} for batches")
        return "sampling-bound", f"workers are busy {_pct(wb)}, the learner waits {_pct(1 - lb)} for batches"
    return "balanced", f"the learner is busy {_pct(lb)} and workers {_pct(wb)}; neither waits much for the other"


def bottleneck(processes: list[dict]) -> dict:
    """The verdict ("learner-bound", "sampling-bound", ...) and one sentence of evidence."""
    by_role: dict[str, list[dict]] = {}
    for p in processes:
        by_role.setdefault(p["role"], []).append(p)
    if "learner" not in by_role and "main" in by_role:
        verdict, evidence = _single_verdict(by_role["main"][0])
    elif "learner" in by_role and "worker" in by_role:
        learner = max(by_role["learner"], key=lambda p: p["wall_s"])  # a restarted learner: the longer lane
        verdict, evidence = _distributed_verdict(learner, by_role["worker"], (by_role.get("replay") or [None])[0],
                                                 (by_role.get("inference") or [None])[0])
    else:
        verdict, evidence = "undetermined", "the trace has no learner and worker lanes to compare"
    return {"verdict": verdict, "sentence": f"{verdict}: {evidence}"}


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None  # a run killed before its end has no summary: the report does without it


def policy_lag(run_dir: str) -> dict:
    """From summary.json (whole run) and metrics.csv's per-interval means; None where missing."""
    summary = _read_json(os.path.join(run_dir, "summary.json")) or {}
    means = []
    try:
        with open(os.path.join(run_dir, "metrics.csv"), newline="") as fh:
            for row in csv.DictReader(fh):
                v = row.get("policy_lag_mean") or ""
                if v not in ("", "-") and math.isfinite(float(v)):
                    means.append(float(v))
    except (OSError, ValueError):
        means = []
    per_interval = None
    if means:
        per_interval = {"rows": len(means), "min": min(means), "median": float(np.median(means)),
                        "max": max(means), "last": means[-1]}
    return {"summary": summary.get("policy_lag"), "per_interval": per_interval,
            "rate_limiter": summary.get("rate_limiter")}


def training_window(trace: Trace) -> tuple[float, float]:
    """The whole trace, cut at the end of the driver's last gather: what follows is the run's stop
    (final evaluation and checkpoint), when every role is idle by design."""
    lo, hi = trace.span
    gathers = [float(e) for ln in trace.lanes if ln.role == "driver"
               for e, n, d in zip(ln.end, ln.name, ln.depth) if n == "gather" and d == 0]
    return lo, (max(gathers) if gathers and max(gathers) > lo else hi)


def build_report(run_dir: str, t_from: float | None = None, t_to: float | None = None) -> dict:
    trace = read_trace(run_dir)
    a, b = training_window(trace) if t_from is None and t_to is None else resolve_window(trace, t_from, t_to)
    processes = process_shares(trace, a, b)
    return {"run_dir": run_dir, "window_s": [round(a, 3), round(b, 3)], "processes": processes,
            "roles": role_breakdown(trace, a, b), "fragment_in_flight": in_flight(trace, a, b),
            "policy_lag": policy_lag(run_dir),
            "bottleneck": bottleneck(processes), "dropped": trace.other.get("dropped", {}),
            "resumed_at_s": resumed_at(trace)}


def _process_table(report: dict) -> list[str]:
    lines = [f"{'process':<20}{'wall s':>9}{'busy':>7}{'waiting':>9}{'idle':>7}"]
    for p in report["processes"]:
        lines.append(f"{p['process']:<20}{p['wall_s']:>9.1f}{_pct(p['busy']):>7}{_pct(p['waiting']):>9}"
                     f"{_pct(p['idle']):>7}")
    return lines


def _role_table(report: dict) -> list[str]:
    cats = sorted({c for row in report["roles"].values() for c in row}, key=_cat_rank)
    width = max([10] + [len(c) + 2 for c in cats])
    lines = [f"{'role':<18}" + "".join(f"{c:>{width}}" for c in cats)]
    for role, row in report["roles"].items():
        lines.append(f"{role:<18}" + "".join(f"{row[c]:>{width}.2f}" if c in row else f"{'-':>{width}}"
                                             for c in cats))
    return lines


def _lag_lines(lag: dict) -> list[str]:
    lines = []
    if lag["summary"]:
        s = lag["summary"]
        lines.append(f"  whole run (summary.json): mean {s['mean']:.2f}, p50 {s['p50']:g}, p90 {s['p90']:g}, "
                     f"max {s['max']:g}")
    if lag["per_interval"]:
        p = lag["per_interval"]
        lines.append(f"  per log interval (metrics.csv, {p['rows']} rows): min {p['min']:.2f}, median "
                     f"{p['median']:.2f}, max {p['max']:.2f}, last {p['last']:.2f}")
    if lag["rate_limiter"]:
        r = lag["rate_limiter"]
        lines.append(f"  held back by the driver: workers {_pct(r.get('workers_blocked_frac', 0))}, "
                     f"learner {_pct(r.get('learner_blocked_frac', 0))} of the run")
    return lines or ["  (no summary.json or metrics.csv)"]


def format_report(report: dict) -> str:
    a, b = report["window_s"]
    out = [f"run: {report['run_dir']}  (trace window {a:.2f}-{b:.2f} s)", ""]
    if report.get("resumed_at_s"):
        out[-1:] = [f"resumed at {', '.join(f'{t:.2f}' for t in report['resumed_at_s'])} s: a process of an earlier "
                    "segment has its own row, its share over its own lane", ""]
    out += _process_table(report) + ["", ("self time by role, seconds (children excluded; rollout = the rest "
                                          "of building a fragment)")]
    out += _role_table(report)
    flight = report.get("fragment_in_flight")
    if flight:
        out += ["", f"fragments in flight (end of a worker's sample to the replay's add), {flight['n']}: median "
                    f"{flight['median_ms']:.1f} ms, p90 {flight['p90_ms']:.1f} ms, max {flight['max_ms']:.1f} ms"]
    out += ["", "policy lag (updates between acting and learning weights):"]
    out += _lag_lines(report["policy_lag"])
    lost = {k: v for k, v in report["dropped"].items() if v}
    if lost:
        out += ["", "events lost to full rings (oldest first): " + ", ".join(f"{k} {v}" for k, v in lost.items())]
    return "\n".join(out + ["", "bottleneck: " + report["bottleneck"]["sentence"]])


def run_report(run_dir: str, as_json: bool = False, t_from: float | None = None, t_to: float | None = None) -> str:
    """The `distrl report` command's output text."""
    report = build_report(run_dir, t_from, t_to)
    return json.dumps(report, indent=2) if as_json else format_report(report)
