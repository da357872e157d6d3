"""What recording a trace costs: env steps/s with `log.trace` on against off, and the cost of one span.

    python -m bench.trace_overhead                     # span cost + 3 cases x 6 on/off pairs (~15 min, 2 cores)
    python -m bench.trace_overhead --span-cost-only    # the per-span cost alone (seconds; printed, not saved)
    python -m bench.trace_overhead --seconds 4 --pairs 1 --out /tmp/t.json   # a smoke run

Runs: `distrl.train` in this process with one embedded Ray for all of them, 2 workers, evaluation
target off, each `--startup` + `--seconds` long (the actors' start-up takes 5-12 s on 2 cores),
measured in its steady state: from 3 s after the first fragment to the end. A pair with a run that
started too slowly to leave 2 s of steady state is skipped and counted.
An on/off pair runs back to back, the order flipping every pair, and the pairs of the cases
interleave, so a slow minute hits both halves of a pair. Overhead of a pair = 1 - on / off; a
case reports the median over its pairs and the quartiles. The cases: Ape-X DQN CartPole async
(the issue's target, < 3%), the same with the learner off (sampling only: workers record two spans
per env step and nothing else competes for the cores, so their cost shows most), PPO CartPole sync.

Span cost: nanoseconds per recorded span (`with tracer.span(...)`, `tracer.complete(...)` as the
workers' per-step spans are recorded) and per disabled span, the loop's own cost subtracted. With the
mean worker step time taken from the traced runs' trace.json, it predicts the worker overhead:
2 x complete() / step time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from bench.common import ROOT, hardware, steady_rates, write_json

CASES = {  # name -> (config, mode, learner on)
    "apex_dqn_cartpole async": ("apex_dqn_cartpole.yaml", "async", True),
    "apex_dqn_cartpole async, sampling only": ("apex_dqn_cartpole.yaml", "async", False),
    "ppo_cartpole sync": ("ppo_cartpole.yaml", "sync", True),
}
WORKERS = 2
SPANS_PER_STEP = 2  # a worker records `inference` and `env_step` for every step of its envs


def _timed_ns(body, n: int) -> float:
    """Best of 5 of nanoseconds per call of `body(n)` (which loops n times)."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        body(n)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def span_cost(n: int = 200_000) -> dict:
    """ns per call of each way of recording, minus an empty loop's ns per iteration."""
    from distrl.observe.trace import Tracer

    on, off = Tracer("worker", 0, enabled=True, capacity=n), Tracer("worker", 0, enabled=False)

    def empty(k):
        for _ in range(k):
            pass

    def span(tr):
        def body(k):
            for _ in range(k):
                with tr.span("env_step", "env"):
                    pass
        return body

    def complete(k):
        t = time.time()
        for _ in range(k):
            on.complete("env_step", "env", t, 0.0001)

    def flow(k):
        for i in range(k):
            on.flow_out("fragment", i)

    loop = _timed_ns(empty, n)
    out = {name: round(_timed_ns(body, n) - loop, 1) for name, body in
           (("span_off_ns", span(off)), ("span_on_ns", span(on)), ("complete_on_ns", complete), ("flow_on_ns", flow))}
    return {"calls": n, **out}


def worker_step_us(run_dir: str) -> float | None:
    """Mean wall time of one worker step (inference + env_step spans) in a traced run."""
    with open(os.path.join(run_dir, "trace.json")) as fh:
        events = json.load(fh)["traceEvents"]
    steps = [e["dur"] for e in events if e.get("ph") == "X" and e["name"] in ("inference", "env_step")]
    return SPANS_PER_STEP * sum(steps) / len(steps) if steps else None


def one_run(case: str, trace: bool, seconds: float, startup: float) -> tuple[float, float | None] | None:
    """(steady env steps/s, mean worker step in µs when traced) of one run; None when start-up took
    so long that no steady window was left to measure."""
    from bench.throughput import _never_learn
    from distrl import train

    config, mode, learn = CASES[case]
    config = os.path.join(ROOT, "configs", config)
    run_dir = tempfile.mkdtemp(prefix="trace-bench-")
    overrides = [f"mode={mode}", f"workers={WORKERS}", f"log.trace={str(trace).lower()}", "eval.target_return=null",
                 "log.progress=false", "log.tensorboard=false", "log.interval_s=0.5", f"stop.max_seconds={startup + seconds}",
                 *([] if learn else _never_learn(config))]
    try:
        train(config, overrides=overrides, run_dir=run_dir)
        rates = steady_rates(run_dir, warmup_s=3.0)
        if rates["window_s"] < 2.0 or rates["env_steps_per_s"] <= 0:
            print(f"{case}: a {startup + seconds:g} s run left {rates['window_s']:.1f} s of steady state "
                  "(start-up took the rest; a larger --startup avoids it)", flush=True)
            return None
        return rates["env_steps_per_s"], worker_step_us(run_dir) if trace else None
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _quantiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def summarise(pairs: list[dict]) -> dict:
    """Median and quartiles of the per-pair overheads, and the medians of each setting's rates."""
    overheads = [1.0 - p["on"] / p["off"] for p in pairs]
    q1, q3 = _quantiles(overheads)
    steps = [p["step_us"] for p in pairs if p["step_us"]]
    return {"pairs": pairs, "overhead_median": statistics.median(overheads), "overhead_q1": q1, "overhead_q3": q3,
            "overhead_min": min(overheads), "overhead_max": max(overheads),
            "median_off": statistics.median(p["off"] for p in pairs),
            "median_on": statistics.median(p["on"] for p in pairs),
            "worker_step_us": statistics.median(steps) if steps else None}


def measure(cases: list[str], pairs: int, seconds: float, startup: float) -> dict:
    from distrl.runtime.ray_setup import init_ray

    init_ray(None)  # once, before the first run: its start-up is not any run's to pay
    out: dict[str, list] = {case: [] for case in cases}
    skipped = dict.fromkeys(cases, 0)  # pairs with a run that had no steady state
    for k in range(pairs):
        for case in cases:
            got = {}
            for trace in ((False, True) if k % 2 == 0 else (True, False)):
                got[trace] = one_run(case, trace, seconds, startup)
            if None in got.values():
                skipped[case] += 1
                continue
            pair = {"off": got[False][0], "on": got[True][0], "step_us": got[True][1], "order": "off,on" if k % 2 == 0 else "on,off"}
            out[case].append(pair)
            print(f"pair {k + 1}/{pairs} {case}: off {pair['off']:.0f}, on {pair['on']:.0f} env steps/s, "
                  f"overhead {100 * (1 - pair['on'] / pair['off']):+.1f}%", flush=True)
    return {case: {**summarise(p), "pairs_skipped": skipped[case]} for case, p in out.items() if p}


def table(results: dict) -> str:
    cost = results["span_cost"]
    lines = [f"span cost: {cost['span_on_ns']:.0f} ns (`with span`), {cost['complete_on_ns']:.0f} ns (`complete`), "
             f"{cost['flow_on_ns']:.0f} ns (flow), {cost['span_off_ns']:.0f} ns (tracing off)"]
    if results["cases"]:
        lines += ["", "| case | pairs | env steps/s off (median) | on (median) | overhead: median of pairs | "
                      "quartiles | min / max | predicted from span cost |", "|---|---|---|---|---|---|---|---|"]
    for name, c in results["cases"].items():
        predicted = (f"{100 * SPANS_PER_STEP * cost['complete_on_ns'] / 1000 / c['worker_step_us']:.1f}%"
                     if c["worker_step_us"] else "-")
        skipped = f" ({c['pairs_skipped']} skipped)" if c["pairs_skipped"] else ""
        lines.append(f"| {name} | {len(c['pairs'])}{skipped} | {c['median_off']:.0f} | {c['median_on']:.0f} | "
                     f"**{100 * c['overhead_median']:.1f}%** | {100 * c['overhead_q1']:.1f}% to {100 * c['overhead_q3']:.1f}% | "
                     f"{100 * c['overhead_min']:.1f}% / {100 * c['overhead_max']:.1f}% | {predicted} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each run after --startup")
    ap.add_argument("--startup", type=float, default=15.0, help="seconds each run allows its actors to start")
    ap.add_argument("--pairs", "--repeats", type=int, default=6, help="on/off pairs per case")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--span-cost-only", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "trace_overhead.json"))
    args = ap.parse_args()
    results = {"command": "python -m bench.trace_overhead " + " ".join(sys.argv[1:]), "hardware": hardware(),
               "seconds": args.seconds, "startup_s": args.startup, "workers": WORKERS, "span_cost": span_cost(), "cases": {}}
    print(table(results), flush=True)
    if args.span_cost_only:  # printed only: the results file keeps the runs it holds
        return
    results["cases"] = measure(args.cases, args.pairs, args.seconds, args.startup)
    write_json(args.out, results)
    print(table(results))


if __name__ == "__main__":
    main()
