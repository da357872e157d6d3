"""`distrl timeline | report | plot` on synthetic run dirs shaped like real ones.

The traces are built from drained dicts with the spec's vocabulary: a learner-bound async run
(the learner never rests, workers sit in `idle`), a sampling-bound one (workers never rest, the
learner sits in `wait_batch`), and a single-mode one. metrics.csv, summary.json and config.yaml
follow what the driver writes.
"""
import csv
import json
import os
import re

import numpy as np
import pytest
import yaml

from distrl.cli import main
from distrl.observe import METRIC_COLUMNS, validate_trace, write_trace
from distrl.observe.plot import group_curve, group_runs, read_run
from distrl.observe.report import bottleneck, build_report
from distrl.observe.timeline import read_trace, resolve_window, timeline_size, title

START = 1_700_000_000.0
RUN_S = 6.0


class Proc:
    """One synthetic process: compact events as a Tracer would drain them (one thread)."""

    def __init__(self, role, index=None, pid=100):
        self.meta = {"role": role, "index": index, "pid": pid, "node": "node-a", "dropped": 0,
                     "threads": {1: (pid, "MainThread")}}
        self.events = []

    def span(self, name, cat, t, dur, **args):
        self.events.append(("X", round((START + t) * 1e6), round(dur * 1e6), name, cat, 1, args or None))
        return t + dur

    def flow(self, ph, flow, flow_id, t):
        self.events.append((ph, round((START + t) * 1e6), 0, flow, flow_id, 1, None))

    def drained(self):
        return {"meta": self.meta, "events": self.events}


def _sample(w, t, frag_id, steps=16):
    """A `sample` span with per-step inference and env_step children; the fragment flows out at its end."""
    t0 = t
    for _ in range(steps):
        t = w.span("inference", "inference", t, 0.0004)
        t = w.span("env_step", "env", t, 0.0008)
    t += 0.001
    w.flow("s", "fragment", frag_id, t - 0.00001)
    w.span("sample", "rollout", t0, t - t0, env_steps=steps * 8)
    return t


def _learner(proc, update_s, wait_s, publishes, t=0.2):
    version = 0
    while t < RUN_S:
        t = proc.span("wait_batch", "wait", t, wait_s)
        t = proc.span("update_block", "learning", t, update_s, updates=8)
        version += 1
        proc.flow("s", "weights", version, t + 0.001)
        publishes.append((t + 0.001, version))
        t = proc.span("publish", "transfer", t, 0.003)


def _worker(w, index, idle_s, publishes, fragments):
    t, k = 0.25 + 0.013 * index, 0
    while t < RUN_S:
        done = [v for when, v in publishes if when < t]
        if done and k % 3 == 0:
            w.flow("f", "weights", done[-1], t + 0.001)
            t = w.span("pull_weights", "transfer", t, 0.003)
        fid = index * 100_000 + k
        t = _sample(w, t, fid)
        fragments.append((t, fid))
        t = w.span("idle", "wait", t, idle_s)
        k += 1


def _replay_and_driver(replay, driver, fragments, held):
    t = 0.0
    for arrive, fid in sorted(fragments):
        t = max(t, arrive + 0.002)
        replay.flow("f", "fragment", fid, t + 0.0002)
        t = replay.span("replay_add", "replay", t, 0.0006)
        if fid % 4 == 0:
            t = replay.span("sample_batch", "replay", t, 0.001)
    t = 0.1
    while t < RUN_S:
        t = driver.span("backpressure" if held else "gather", "wait", t, 0.2, ready=2, late=0)
        if int(t) != int(t - 0.2):
            t = driver.span("log", "driver", t, 0.002)
    driver.span("checkpoint", "checkpoint", RUN_S, 0.05)


def _evaluator(ev, publishes):
    t = 1.0
    while t < RUN_S:
        done = [v for when, v in publishes if when < t]
        if done:
            ev.flow("f", "weights", done[-1], t + 0.001)
            t = ev.span("pull_weights", "transfer", t, 0.003)
        t = ev.span("evaluate", "evaluation", t, 0.4) + 1.0


def distributed_trace(kind, workers=3):
    """Drained dicts of a learner-bound or sampling-bound async run."""
    learner_bound = kind == "learner"
    driver, learner, replay, ev = Proc("driver", pid=10), Proc("learner", pid=11), Proc("replay", pid=12), \
        Proc("evaluator", pid=40)
    procs = [Proc("worker", i, pid=20 + i) for i in range(workers)]
    publishes, fragments = [], []
    _learner(learner, 0.25 if learner_bound else 0.03, 0.003 if learner_bound else 0.07, publishes)
    for i, w in enumerate(procs):
        _worker(w, i, 0.3 if learner_bound else 0.002, publishes, fragments)
    _replay_and_driver(replay, driver, fragments, held=learner_bound)
    _evaluator(ev, publishes)
    return [p.drained() for p in [ev, *procs, replay, learner, driver]]  # any order: the writer sorts


def single_trace():
    main_p, ev, publishes, t, k = Proc("main", pid=10), Proc("evaluator", pid=40), [], 0.2, 0
    while t < RUN_S:
        t = _sample(main_p, t, k)
        main_p.flow("f", "fragment", k, t + 0.0002)
        t = main_p.span("replay_add", "replay", t, 0.0006)
        t = main_p.span("update_block", "learning", t, 0.2, updates=4)
        publishes.append((t, k))
        k += 1
    _evaluator(ev, publishes)
    return [main_p.drained(), ev.drained()]


def write_run(run_dir, drained=None, mode="async", seed=0, curve_scale=1.0, trace=True, metrics=True):
    """A run dir as a real run leaves it: config.yaml, metrics.csv, summary.json (and trace.json)."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w") as fh:
        yaml.safe_dump({"algo": "impala", "mode": mode, "workers": 3, "seed": seed,
                        "env": {"id": "CartPole-v1", "num_envs": 8}, "eval": {"target_return": 475.0}}, fh)
    rng = np.random.default_rng(seed)
    if metrics:
        with open(os.path.join(run_dir, "metrics.csv"), "w", newline="") as fh:
            out = csv.DictWriter(fh, fieldnames=METRIC_COLUMNS)
            out.writeheader()
            for i in range(1, 13):
                ret = "" if i < 2 else round(min(500.0, curve_scale * 45 * i + rng.normal(0, 10)), 2)
                out.writerow({"wall_s": round(i * 0.5 + rng.uniform(0, 0.05), 3), "env_steps": 2048 * i,
                              "updates": 8 * i, "eval_return_mean": ret, "policy_lag_mean": round(rng.uniform(0, 3), 2),
                              "policy_lag_max": 4})
    summary = {"algo": "impala", "env": "CartPole-v1", "mode": mode, "workers": 3, "wall_s": RUN_S,
               "policy_lag": {"mean": 1.4, "p50": 1.0, "p90": 3.0, "max": 5.0},
               "rate_limiter": {"workers_blocked_frac": 0.6, "learner_blocked_frac": 0.02}}
    with open(os.path.join(run_dir, "summary.json"), "w") as fh:
        json.dump(summary, fh)
    if trace:
        write_trace(os.path.join(run_dir, "trace.json"), drained, START, extra={"mode": mode})
    return str(run_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return {"learner": write_run(base / "learner_bound", distributed_trace("learner")),
            "sampling": write_run(base / "sampling_bound", distributed_trace("sampling")),
            "single": write_run(base / "single", single_trace(), mode="single")}


def run_main(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def png_size(path):
    from matplotlib.image import imread

    img = imread(path)
    return img.shape[1], img.shape[0], img


def test_synthetic_traces_are_valid(runs):
    for run_dir in runs.values():
        assert validate_trace(os.path.join(run_dir, "trace.json")) == []


@pytest.mark.parametrize("kind", ["learner", "single"])
def test_timeline_writes_a_png_of_the_expected_size(runs, capsys, kind):
    code, out, err = run_main(capsys, "timeline", runs[kind])
    path = os.path.join(runs[kind], "timeline.png")
    assert code == 0 and out.strip() == path and err == ""
    n_lanes = len(read_trace(runs[kind]).lanes)
    assert n_lanes == {"learner": 7, "single": 2}[kind]  # driver, learner, replay, 3 workers, evaluator
    w, h, img = png_size(path)
    assert (w, h) == timeline_size(n_lanes) == (1600, 160 + 40 * n_lanes)
    assert img[..., :3].std() > 0.05  # something was drawn, not a blank canvas


def test_timeline_default_window_is_two_seconds_with_every_lane_active(runs):
    trace = read_trace(runs["learner"])
    a, b = resolve_window(trace, None, None)
    assert b - a == pytest.approx(2.0)
    assert all(((ln.end > a) & (ln.start < b)).any() for ln in trace.lanes)


def test_from_to_restrict_the_window(runs, capsys, tmp_path):
    out_png = tmp_path / "window.png"
    code, out, _ = run_main(capsys, "timeline", runs["learner"], "--from", "1", "--to", "2.5", "-o", out_png)
    assert code == 0 and os.path.getsize(out_png) > 0
    trace = read_trace(runs["learner"])
    assert resolve_window(trace, 1, 2.5) == (1.0, 2.5)
    assert resolve_window(trace, 3, None) == (3.0, trace.span[1])  # a missing edge is the trace's own
    code, out, _ = run_main(capsys, "report", runs["learner"], "--from", "1", "--to", "2.5", "--json")
    report = json.loads(out)
    assert code == 0 and report["window_s"] == [1.0, 2.5]
    assert all(p["wall_s"] <= 1.5 + 1e-6 for p in report["processes"])
    whole = build_report(runs["learner"])
    assert whole["window_s"][1] - whole["window_s"][0] > 5


def test_timeline_title_states_the_window_and_the_traces_own_start_and_end(runs):
    trace = read_trace(runs["learner"])  # the driver's first gather starts at 0.1 s, the learner's last span ends last
    assert title(trace, (1.0, 2.5)) == "learner_bound: 1.00-2.50 s shown; the trace covers 0.10-6.11 s"
    assert title(trace, (1.0, 2.5), every=3).endswith("0.10-6.11 s; 1 in 3 flow arrows drawn")


def test_report_names_the_learner_on_a_learner_bound_run(runs, capsys):
    code, out, err = run_main(capsys, "report", runs["learner"])
    assert code == 0 and err == ""
    last = out.strip().splitlines()[-1]
    assert last.startswith("bottleneck: learner-bound: the learner is busy 9"), last
    assert "workers wait" in last
    for name in ("driver", "learner", "replay", "worker 0", "worker 2", "evaluator"):
        assert any(line.startswith(name) for line in out.splitlines()), name
    assert "policy lag" in out and "p90 3" in out
    # Each fragment leaves its worker 10 µs before the end of `sample`; the replay adds it 2.2 ms after that end.
    assert "fragments in flight (end of a worker's sample to the replay's add), 54: median 2.2 ms, p90 2.2 ms" in out


def test_report_names_the_workers_on_a_sampling_bound_run(runs, capsys):
    code, out, _ = run_main(capsys, "report", runs["sampling"], "--json")
    report = json.loads(out)
    assert code == 0 and report["bottleneck"]["verdict"] == "sampling-bound"
    m = re.fullmatch(r"sampling-bound: workers are busy (\d+)%, the learner waits (\d+)% for batches",
                     report["bottleneck"]["sentence"])
    assert m and int(m.group(1)) >= 80 and int(m.group(2)) >= 60, report["bottleneck"]
    learner = next(p for p in report["processes"] if p["process"] == "learner")
    assert learner["waiting"] > 0.6 and learner["busy"] < 0.35
    workers = report["roles"]["worker"]
    assert workers["env"] > workers["inference"] > 0  # self time: env_step and inference inside sample
    assert workers["rollout"] < workers["env"]  # the container keeps only its own remainder
    assert report["policy_lag"]["summary"]["p90"] == 3.0 and report["policy_lag"]["per_interval"]["rows"] == 12
    flight = report["fragment_in_flight"]  # a busy replay server keeps some fragments waiting longer
    assert flight["median_ms"] == pytest.approx(2.21) and flight["max_ms"] > 2.5 and flight["n"] > 700


def test_report_single_mode_judges_learning_against_sampling(runs, capsys):
    code, out, _ = run_main(capsys, "report", runs["single"], "--json")
    verdict = json.loads(out)["bottleneck"]
    assert code == 0 and verdict["verdict"] == "learner-bound" and "main process" in verdict["sentence"]


def test_an_idle_learner_is_idle_and_the_stop_is_left_out_of_the_window(tmp_path, capsys):
    """A learner that only published once (replay never filled) spans the run idle, not 100% busy;
    the report's window ends with the driver's last gather, before the final checkpoint."""
    drained = distributed_trace("sampling")
    learner = next(d for d in drained if d["meta"]["role"] == "learner")
    learner["events"] = [e for e in learner["events"] if e[1] < (START + 0.3) * 1e6]  # one early publish
    run = write_run(tmp_path / "idle_learner", drained)
    code, out, _ = run_main(capsys, "report", run, "--json")
    report = json.loads(out)
    row = next(p for p in report["processes"] if p["process"] == "learner")
    assert code == 0 and row["busy"] < 0.05 and row["idle"] > 0.9, row
    driver = next(d for d in drained if d["meta"]["role"] == "driver")
    last_gather = max(e[1] + e[2] for e in driver["events"] if e[3] == "gather") / 1e6 - START
    assert report["window_s"][1] == pytest.approx(last_gather, abs=0.002)
    assert report["window_s"][1] < read_trace(run).span[1]  # what follows the last gather is left out
    assert report["bottleneck"]["verdict"] == "sampling-bound"


def test_bottleneck_rule_on_shares():
    def proc(role, busy):
        return {"role": role, "process": role, "busy": busy, "waiting": 1 - busy, "wall_s": 1.0, "top_s": {}}

    assert bottleneck([proc("learner", 0.9), proc("worker", 0.85)])["verdict"] == "balanced"
    assert bottleneck([proc("learner", 0.2), proc("worker", 0.3)])["verdict"] == "overhead-bound"
    assert bottleneck([proc("learner", 0.3), proc("worker", 0.9), proc("replay", 0.97)])["verdict"] == "replay-bound"
    assert bottleneck([proc("learner", 0.9)])["verdict"] == "undetermined"


def test_plot_draws_runs_of_one_config_as_one_median_group(tmp_path, capsys):
    dirs = [write_run(tmp_path / f"seed{s}", seed=s, curve_scale=1 + 0.2 * s, trace=False) for s in range(3)]
    other = write_run(tmp_path / "sync", mode="sync", seed=9, curve_scale=0.5, trace=False)
    code, out, err = run_main(capsys, "plot", *dirs, other)
    path = os.path.join(dirs[0], "plot.png")
    assert code == 0 and out.strip() == path and err == ""
    w, h, img = png_size(path)
    assert (w, h) == (1400, 620) and img[..., :3].std() > 0.05
    groups = group_runs([read_run(d) for d in dirs + [other]])
    assert [len(g) for g in groups.values()] == [3, 1]
    curve = group_curve(groups[("impala", "CartPole-v1", "async")], "env_steps")
    x = curve["x"][len(curve["x"]) // 2]
    at_x = [r["ret"][np.searchsorted(r["env_steps"], x, side="right") - 1] for r in groups[("impala", "CartPole-v1", "async")]]
    i = len(curve["x"]) // 2
    assert curve["median"][i] == pytest.approx(np.median(at_x))
    assert curve["low"][i] == pytest.approx(min(at_x)) and curve["high"][i] == pytest.approx(max(at_x))


@pytest.mark.parametrize("argv, message", [
    (["timeline", "{bare}"], "has no trace.json (train with --set log.trace=true)"),
    (["report", "{bare}"], "has no trace.json"),
    (["plot", "{bare}"], "has no metrics.csv"),
    (["plot", "{no_evals}"], "has no eval_return_mean values"),
    (["timeline", "{missing}"], "run dir not found"),
    (["timeline", "{learner}", "--from", "3", "--to", "2"], "empty window"),
    (["report", "{learner}", "--from", "50", "--to", "60"], "no spans between 50 s and 60 s"),
    (["timeline", "{learner}", "-o", "{missing}/t.png"], "cannot write"),
    (["timeline", "{learner}", "--from", "soon"], "invalid float value"),
])
def test_missing_data_is_one_line_and_exit_2(runs, tmp_path, capsys, argv, message):
    bare = write_run(tmp_path / "bare", trace=False, metrics=False)
    no_evals = write_run(tmp_path / "no_evals", trace=False)
    with open(os.path.join(no_evals, "metrics.csv"), "w") as fh:
        fh.write(",".join(METRIC_COLUMNS) + "\n" + "1.0,100" + "," * (len(METRIC_COLUMNS) - 2) + "\n")
    names = {"bare": bare, "no_evals": no_evals, "missing": str(tmp_path / "nope"), "learner": runs["learner"]}
    code, out, err = run_main(capsys, *[a.format(**names) for a in argv])
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distrl: error: ") and message in lines[0], err


def test_lanes_name_restarted_processes_and_extra_threads(tmp_path):
    first, second, learner = Proc("worker", 1, pid=20), Proc("worker", 1, pid=30), Proc("learner", pid=11)
    first.span("sample", "rollout", 0.1, 0.5)
    second.span("sample", "rollout", 1.0, 0.5)  # the same worker after a restart: a new pid
    learner.span("update_block", "learning", 0.1, 1.0)
    learner.meta["threads"][2] = (1102, "prefetch")
    learner.events.append(("X", round((START + 0.2) * 1e6), 300_000, "wait_batch", "wait", 2, None))
    run_dir = tmp_path / "restart"
    os.makedirs(run_dir)
    write_trace(str(run_dir / "trace.json"), [first.drained(), second.drained(), learner.drained()], START)
    labels = [ln.label for ln in read_trace(str(run_dir)).lanes]
    assert labels == ["learner", "learner · prefetch", "worker 1 (pid 20)", "worker 1 (pid 30)"]
