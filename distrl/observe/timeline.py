"""`distrl timeline`: read a run's trace.json and draw a window of it as one PNG.

Also the reading side shared with `distrl report`: `read_trace` turns the file into lanes (one
per process thread) of spans with their nesting depth and self time, plus the flows between lanes.
matplotlib is imported only inside the drawing functions, so `import distrl` stays light.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from distrl.observe.rundir import RunDataError, run_file
from distrl.observe.trace import split_name

# One colour per category; `wait` is pale so that busy time stands out.
CATEGORY_COLORS = {
    "rollout": "#9ecae1", "env": "#31a354", "inference": "#756bb1", "transfer": "#fd8d3c",
    "replay": "#8c6d31", "learning": "#de2d26", "evaluation": "#17becf", "checkpoint": "#525252",
    "driver": "#3182bd", "wait": "#d9d9d9",
}
OTHER_COLOR = "#bc80bd"
FLOW_COLORS = {"fragment": "#08519c", "weights": "#a50f15"}
DEFAULT_WINDOW_S = 2.0
MAX_ARROWS = 160  # beyond this arrows hide the spans; a regular subset is drawn instead
# Pixel geometry (dpi 100): fixed margins around a band of lanes, so text never collides.
WIDTH_PX, LANE_PX, TOP_PX, BOTTOM_PX, LEFT_PX, RIGHT_PX = 1600, 40, 100, 60, 190, 30
HEIGHTS = {0: 0.8, 1: 0.5, 2: 0.3}  # bar height by nesting depth: children drawn inside their parent


@dataclass
class Lane:
    """One thread of one process: its spans as parallel arrays, ordered by start."""
    pid: int
    tid: int
    process: str  # e.g. "worker 1"
    label: str  # the process name, plus the thread's name when the process has several threads
    sort_key: tuple
    start: np.ndarray = field(default_factory=lambda: np.zeros(0))  # seconds since the run's start
    end: np.ndarray = field(default_factory=lambda: np.zeros(0))
    depth: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    self_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # duration minus direct children
    name: list = field(default_factory=list)
    cat: list = field(default_factory=list)

    @property
    def role(self) -> str:
        return split_name(self.process)[0]


@dataclass
class Trace:
    run_dir: str
    lanes: list[Lane]
    flows: list[tuple]  # (flow, t_out, lane_out, t_in, lane_in): lane indices into `lanes`
    other: dict

    @property
    def span(self) -> tuple[float, float]:
        return (min(float(ln.start.min()) for ln in self.lanes if len(ln.start)),
                max(float(ln.end.max()) for ln in self.lanes if len(ln.end)))


def _load(run_dir: str) -> dict:
    path = run_file(run_dir, "trace.json", " (train with --set log.trace=true)")
    try:
        with open(path) as fh:
            obj = json.load(fh)
    except (OSError, ValueError) as e:
        raise RunDataError(f"{path} is not a readable trace: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise RunDataError(f"{path} is not a trace-event file (no traceEvents list)")
    return obj


def _nesting(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depth and self time of spans sorted by (start, -duration) on one thread."""
    depth, self_s, stack = np.zeros(len(starts), int), (ends - starts).copy(), []
    for i in range(len(starts)):
        while stack and ends[stack[-1]] <= starts[i]:
            stack.pop()
        depth[i] = len(stack)
        if stack:
            self_s[stack[-1]] -= ends[i] - starts[i]
        stack.append(i)
    return depth, np.maximum(self_s, 0)


def _lanes(events: list, names: dict, sorts: dict, threads: dict) -> list[Lane]:
    by_thread: dict[tuple, list] = {}
    for ev in events:
        if ev.get("ph") == "X":
            by_thread.setdefault((ev["pid"], ev["tid"]), []).append(ev)
    pids = list(dict.fromkeys(pid for pid, _ in by_thread))
    tids_of = {pid: sum(p == pid for p, _ in by_thread) for pid in pids}
    shared = {n for n in names.values() if sum(names.get(p) == n for p in pids) > 1}  # a restarted process
    lanes = []
    for (pid, tid), spans in by_thread.items():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        process = names.get(pid, f"pid {pid}")
        label = f"{process} (pid {pid})" if process in shared else process
        label = label if tids_of[pid] == 1 or tid == pid else f"{label} · {threads.get((pid, tid), tid)}"[:32]
        # Nest in integer µs: back-to-back spans must not overlap by a float rounding error.
        ts = np.rint(np.array([e["ts"] for e in spans], float)).astype(np.int64)
        te = ts + np.rint(np.array([e["dur"] for e in spans], float)).astype(np.int64)
        depth, self_us = _nesting(ts, te)
        start, end, self_s = ts / 1e6, te / 1e6, self_us / 1e6
        lanes.append(Lane(pid, tid, process, label, (sorts.get(pid, 10**9), pid, tid != pid, tid), start, end,
                          depth, self_s, [e["name"] for e in spans], [e.get("cat", "") for e in spans]))
    return sorted(lanes, key=lambda ln: ln.sort_key)


def _flows(events: list, lanes: list[Lane]) -> list[tuple]:
    where = {(ln.pid, ln.tid): i for i, ln in enumerate(lanes)}
    halves: dict[object, dict] = {}
    for ev in events:
        if ev.get("ph") in ("s", "f") and (ev["pid"], ev["tid"]) in where:
            halves.setdefault(ev.get("id"), {})[ev["ph"]] = ev
    return [(pair["s"].get("cat", ""), pair["s"]["ts"] / 1e6, where[(pair["s"]["pid"], pair["s"]["tid"])],
             pair["f"]["ts"] / 1e6, where[(pair["f"]["pid"], pair["f"]["tid"])])
            for pair in halves.values() if "s" in pair and "f" in pair]


def read_trace(run_dir: str) -> Trace:
    """The run's trace as lanes and flows; RunDataError when it is missing, unreadable or empty."""
    obj = _load(run_dir)
    events = [ev for ev in obj["traceEvents"] if isinstance(ev, dict) and "pid" in ev]
    names, sorts, threads = {}, {}, {}
    for ev in events:
        if ev.get("ph") == "M":
            value = next(iter((ev.get("args") or {}).values()), None)
            if ev.get("name") == "process_name":
                names[ev["pid"]] = str(value)
            elif ev.get("name") == "process_sort_index":
                sorts[ev["pid"]] = value
            elif ev.get("name") == "thread_name":
                threads[(ev["pid"], ev.get("tid"))] = value
    lanes = _lanes(events, names, sorts, threads)
    if not lanes:
        raise RunDataError(f"{os.path.join(run_dir, 'trace.json')} holds no spans")
    return Trace(run_dir, lanes, _flows(events, lanes), obj.get("otherData") or {})


# --- the window -----------------------------------------------------------------------------

def _covered_before(lane: Lane, t: np.ndarray) -> np.ndarray:
    """Seconds of the lane's top-level spans before each time in `t` (they are disjoint)."""
    top = lane.depth == 0
    s, e = lane.start[top], lane.end[top]
    cum = np.concatenate([[0.0], np.cumsum(e - s)])
    k = np.searchsorted(s, t, side="right")
    last_end = np.where(k > 0, e[np.maximum(k - 1, 0)], t)
    return cum[k] - np.maximum(last_end - t, 0.0)


def default_window(trace: Trace, length: float = DEFAULT_WINDOW_S) -> tuple[float, float]:
    """`length` seconds in which the most lanes are active, then the most covered; all of a short trace."""
    t0, t1 = trace.span
    if t1 - t0 <= length:
        return t0, t1
    step = max(length / 4, (t1 - t0 - length) / 2000)  # bounded work on an hours-long trace
    starts = np.append(np.arange(t0, t1 - length, step), t1 - length)
    cover = np.array([_covered_before(ln, starts + length) - _covered_before(ln, starts) for ln in trace.lanes])
    score = (cover > 0).sum(axis=0) * 1e6 + cover.sum(axis=0)  # active lanes first, busy time second
    best = float(starts[int(np.argmax(score))])
    return best, best + length


def resolve_window(trace: Trace, t_from: float | None, t_to: float | None) -> tuple[float, float]:
    """The window asked for (a missing edge is the trace's own); the default when neither is given."""
    if t_from is None and t_to is None:
        return default_window(trace)
    lo, hi = trace.span
    a = lo if t_from is None else float(t_from)
    b = hi if t_to is None else float(t_to)
    if b <= a:
        raise RunDataError(f"empty window: --from {a:g} is not before --to {b:g}")
    if not any(((ln.end > a) & (ln.start < b)).any() for ln in trace.lanes):
        raise RunDataError(f"{trace.run_dir}: no spans between {a:g} s and {b:g} s (the trace covers {lo:.2f}-{hi:.2f} s)")
    return a, b


# --- drawing --------------------------------------------------------------------------------

def save_png(fig, path: str) -> None:
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:  # a bad -o path is the user's to fix: one line, not a traceback
        raise RunDataError(f"cannot write {path}: {e.strerror or e}") from None


def timeline_size(n_lanes: int) -> tuple[int, int]:
    """(width, height) in pixels of a timeline with this many lanes."""
    return WIDTH_PX, TOP_PX + BOTTOM_PX + LANE_PX * n_lanes


def _figure(n_lanes: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w, h = timeline_size(n_lanes)
    fig = Figure(figsize=(w / 100, h / 100), dpi=100)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=LEFT_PX / w, right=1 - RIGHT_PX / w, top=1 - TOP_PX / h, bottom=BOTTOM_PX / h)
    return fig, fig.add_subplot(1, 1, 1)


def _draw_spans(ax, lanes: list[Lane], a: float, b: float) -> list[str]:
    """Bars per lane, grouped by (depth, category) so deeper ones paint over their parents."""
    seen, px = [], (b - a) / (WIDTH_PX - LEFT_PX - RIGHT_PX)
    for y, ln in enumerate(lanes):
        inside = np.flatnonzero((ln.end > a) & (ln.start < b))
        groups: dict[tuple, list] = {}
        for i in inside:
            s, depth = max(ln.start[i], a), min(int(ln.depth[i]), 2)
            # A short top-level span gets a pixel, or it would vanish; children keep their true width,
            # so dense env/inference steps blend in proportion instead of the last drawn one winning.
            groups.setdefault((depth, ln.cat[i]), []).append((s, max(min(ln.end[i], b) - s, px if depth == 0 else 0)))
        for (depth, cat), xr in sorted(groups.items(), key=lambda kv: kv[0][0]):
            h = HEIGHTS[depth]
            ax.broken_barh(xr, (y - h / 2, h), facecolors=CATEGORY_COLORS.get(cat, OTHER_COLOR),
                           linewidth=0, zorder=2 + depth)
            seen.append(cat)
    return seen


def _draw_flows(ax, flows: list[tuple], a: float, b: float) -> tuple[list[str], int]:
    """Arrows from producer to consumer lane; (flow kinds drawn, 1-in-k subsampling used)."""
    shown = [f for f in flows if a <= f[1] <= b and a <= f[3] <= b]
    every = max(1, -(-len(shown) // MAX_ARROWS))
    for flow, t_out, lane_out, t_in, lane_in in shown[::every]:
        ax.annotate("", xy=(t_in, lane_in), xytext=(t_out, lane_out), zorder=6, annotation_clip=False,
                    arrowprops={"arrowstyle": "-|>", "color": FLOW_COLORS.get(flow, "black"), "lw": 0.6,
                                "alpha": 0.7, "shrinkA": 0, "shrinkB": 0, "mutation_scale": 7})
    return sorted({f[0] for f in shown}), every


def _legend(fig, cats: list[str], flows: list[str]) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    order = [c for c in CATEGORY_COLORS if c in cats] + sorted(set(cats) - set(CATEGORY_COLORS))
    handles = [Patch(facecolor=CATEGORY_COLORS.get(c, OTHER_COLOR), label=c or "(no category)") for c in order]
    handles += [Line2D([], [], color=FLOW_COLORS.get(f, "black"), marker=">", markersize=5, lw=1,
                       label=f"{f} flow") for f in flows]
    h_px = fig.get_size_inches()[1] * 100
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 12), frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, 1 - 38 / h_px), handlelength=1.6, columnspacing=1.4)


def resumed_at(trace: Trace) -> list[float]:
    """The run times at which a resumed segment of the run took over (none for a run never resumed)."""
    segments = trace.other.get("segments") or []
    return [float(s["from_s"]) for s in segments[1:] if isinstance(s, dict) and isinstance(s.get("from_s"), (int, float))]


def _draw_resumes(ax, trace: Trace, a: float, b: float) -> None:
    for t in resumed_at(trace):
        if a <= t <= b:  # earlier segments' events end here: the resumed run redid what came after
            ax.axvline(t, color="#252525", lw=1.0, ls="--", zorder=7)
            ax.annotate("resumed", (t, -0.5), xytext=(3, 2), textcoords="offset points", fontsize=8,
                        va="bottom", annotation_clip=False)


def title(trace: Trace, window: tuple[float, float], every: int = 1) -> str:
    """The run, the window shown and the trace's own first and last second (both since the run's start)."""
    (a, b), (t0, t1) = window, trace.span
    note = f"; 1 in {every} flow arrows drawn" if every > 1 else ""
    resumes = resumed_at(trace)
    if resumes:
        note += f"; resumed at {', '.join(f'{t:.2f}' for t in resumes)} s"
    return (f"{os.path.basename(os.path.normpath(trace.run_dir))}: {a:.2f}-{b:.2f} s shown; "
            f"the trace covers {t0:.2f}-{t1:.2f} s{note}")


def draw_timeline(trace: Trace, window: tuple[float, float], out_path: str) -> str:
    """Write the PNG for `window` (seconds since the run's start) to `out_path`; returns the path."""
    a, b = window
    lanes = trace.lanes  # every lane, even one idle in the window: its emptiness is information
    fig, ax = _figure(len(lanes))
    cats = _draw_spans(ax, lanes, a, b)
    kinds, every = _draw_flows(ax, trace.flows, a, b)
    _draw_resumes(ax, trace, a, b)
    _legend(fig, cats, kinds)
    ax.set_yticks(range(len(lanes)), [ln.label for ln in lanes], fontsize=9)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(a, b)
    ax.set_xlabel("seconds since the run's start", fontsize=9)
    ax.tick_params(axis="x", labelsize=9)
    for y in range(len(lanes) - 1):  # thin separators keep neighbouring lanes apart
        ax.axhline(y + 0.5, color="#eeeeee", lw=0.8, zorder=1)
    ax.grid(axis="x", color="#f0f0f0", lw=0.6, zorder=0)
    ax.set_axisbelow(True)
    fig.suptitle(title(trace, window, every), fontsize=11, y=1 - 8 / (fig.get_size_inches()[1] * 100), va="top")
    save_png(fig, out_path)
    return out_path


def run_timeline(run_dir: str, t_from: float | None = None, t_to: float | None = None,
                 out: str | None = None) -> str:
    """The `distrl timeline` command: read, pick the window, draw; returns the PNG's path."""
    trace = read_trace(run_dir)
    window = resolve_window(trace, t_from, t_to)
    return draw_timeline(trace, window, out or os.path.join(run_dir, "timeline.png"))
