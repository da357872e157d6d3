"""A paper model of distributed throughput from per-role costs, against measured runs.

    python -m bench.model [--config configs/apex_dqn_cartpole.yaml] [--workers 1 2 3 4] [--nodes 1 2 3]
                          [--seconds 15] [--out bench/results/model.json]
    python -m bench.model --show bench/results/model.json     # the tables of a measured JSON, no runs

1. Per-role costs, measured on 1-worker async runs (sampling only, then learning), the four the
   design names kept apart so a user can see which one to cut:
   - env step: the worker's time stepping its envs (and writing the step into the fragment), per env
     step, from the worker's own timers (summary.json `time_breakdown_s`);
   - inference per obs: one `policy.act` on the worker's `num_envs` observations, timed in this process
     on one thread (the policy's torch network, as workers run it), per observation;
   - update: the learner's busy wall time and CPU per update, and the CPU the other processes spend on it
     (the replay server sampling the batch and taking its priorities, the batch's transfer);
   - transfer per fragment: the worker's gap between two calls (the fragment leaving, the driver's gather,
     the next call arriving) and its weight pull, and the CPU the other processes (driver, replay
     server, parameter server, raylet, GCS, the idle learner) spend per fragment.
   The worker's wall time per fragment is env step x F + inference per obs x F + the per-fragment
   overhead (building the fragment: n-step targets and priorities; the pull; the transfer gap; what is
   left, Ray's per-call work), F = num_envs x fragment_length. CPU seconds come from /proc over a steady
   window: the worker's (its Ray threads included) and everyone else's, per fragment.
2. The model, with W workers on C cores (all Ray nodes of this machine share its cores):
      sampling only:  fragments/s = min(W / worker wall, C / (worker CPU + transfer CPU))
      learning:       updates/s  = min(1 / learner busy, C / (learner CPU + replay CPU + k (worker CPU + transfer CPU) / F),
                                       fragments/s x F / k)
   where k = batch_size / samples_per_insert env steps per update (the rate limiter's ratio); env
   steps/s = k x updates/s. The smallest bound names what saturates: the workers, the cores, or the
   learner (more workers then add nothing); the learner saturates at the W whose sampling feeds it.
3. Measurements: the same runs with W = 1-4, and with the largest W spread over a local Ray cluster of
   1-3 nodes (`ray.cluster_utils.Cluster`) on this machine. The model is fitted on W = 1 only.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time

from bench.common import ROOT, hardware, steady_rates, write_json

CONFIG = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
CLK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(name))
    return kids


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "rest"
    if pid == os.getpid():
        return "driver"
    for role, mark in (("worker", "ray::RolloutWorker"), ("learner", "ray::Learner")):
        if mark in cmd:
            return role
    return "rest"


def cpu_by_role() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process and all its descendants, by role."""
    kids, out, todo = _children(), {}, [os.getpid()]
    while todo:
        pid = todo.pop()
        todo.extend(kids.get(pid, []))
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            used = (int(fields[11]) + int(fields[12])) / CLK
        except (OSError, ValueError, IndexError):
            continue
        role = _role(pid)
        out[role] = out.get(role, 0.0) + used
    return out


class CpuWindow:
    """CPU seconds by role between `start_s` and `start_s + length_s` after the run's start."""

    def __init__(self, start_s: float, length_s: float):
        self.start_s, self.length_s = start_s, length_s
        self.result: dict | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.time()
        self.thread.start()

    def _run(self) -> None:
        time.sleep(self.start_s)
        a, ta = cpu_by_role(), time.time()
        time.sleep(self.length_s)
        b, tb = cpu_by_role(), time.time()
        self.result = {"from_s": ta - self.t0, "to_s": tb - self.t0,
                       "cpu_s": {k: b.get(k, 0.0) - a.get(k, 0.0) for k in b}}


def _rows_between(run_dir: str, a: float, b: float) -> dict:
    import csv

    rows = [r for r in csv.DictReader(open(os.path.join(run_dir, "metrics.csv")))]
    first = min(rows, key=lambda r: abs(float(r["wall_s"]) - a))
    last = min(rows, key=lambda r: abs(float(r["wall_s"]) - b))
    dt = float(last["wall_s"]) - float(first["wall_s"])
    return {k: (int(last[k]) - int(first[k])) / dt for k in ("env_steps", "updates")}


def one_run(config: str, workers: int, seconds: float, learn: bool, address: str | None = None,
            extra: list[str] = ()) -> dict:
    """An async run: steady env steps/s and updates/s, CPU seconds by role per second, and the workers'
    own time breakdown (env, inference, pull, idle) over the whole run with the env steps it covers."""
    from bench.throughput import _never_learn
    from distrl import train

    overrides = ["mode=async", f"workers={workers}", "eval.target_return=null", "log.progress=false",
                 "log.tensorboard=false", "log.interval_s=0.5", f"stop.max_seconds={seconds + 12}", *extra]
    if not learn:
        overrides += _never_learn(config)
    run_dir = tempfile.mkdtemp(prefix="bench-model-")
    start = time.time()
    window = CpuWindow(8.0, seconds)  # start-up (Ray, actors, replay warm-up) is over by 8 s
    summary = train(config, overrides=overrides, run_dir=run_dir, start_time=start, address=address)
    window.thread.join()
    w = window.result
    rates = _rows_between(run_dir, w["from_s"], w["to_s"])
    span = w["to_s"] - w["from_s"]
    tb, wall = summary["time_breakdown_s"], summary["wall_s"]
    return {"workers": workers, "learn": learn, "env_steps_per_s": rates["env_steps"],
            "updates_per_s": rates["updates"], "cpu_per_s": {k: v / span for k, v in w["cpu_s"].items()},
            "worker_idle_frac": tb.get("worker_idle_s", 0.0) / (workers * wall),
            "learner_wait_frac": tb.get("learner_wait_s", 0.0) / wall, "steady": steady_rates(run_dir),
            "time_breakdown_s": tb, "env_steps_total": summary["env_steps"]}


def act_s_per_obs(config: str, reps: int = 21, calls: int = 500) -> float:
    """One `policy.act(obs, explore=True)` on a worker's `num_envs` observations, per observation. The
    worker's own timer around act also covers building the fragment, so inference is timed here, alone,
    on one BLAS thread as a worker runs it. The fastest of `reps` timings: the 1-worker run's worker has
    a core to itself, and other load on the machine only ever adds to a timing."""
    from threadpoolctl import threadpool_limits

    from distrl.config import load_config
    from distrl.roles.factory import make_algorithm, make_vector_env, policy_seed

    cfg = load_config(config)
    algo = make_algorithm(cfg)
    policy = algo.make_policy(0, 1, policy_seed(cfg.seed, 0))
    policy.set_weights(algo.make_learner("cpu").get_weights(), 0)
    obs = make_vector_env(cfg.env.id, cfg.env.num_envs, cfg.seed, cfg.env.kwargs, type(algo).multi_agent).obs
    times = []
    with threadpool_limits(1, user_api="blas"):  # scoped: the driver's runs keep their own settings
        for _ in range(calls // 10):
            policy.act(obs, True)
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(calls):
                policy.act(obs, True)
            times.append((time.perf_counter() - t0) / calls)
    return min(times) / cfg.env.num_envs


def fragment_costs(sampling: dict, F: int, act_s: float) -> dict:
    """The worker's wall time per fragment split into env steps, inference and the per-fragment overhead,
    and the CPU per fragment of the worker and of everyone else, from the 1-worker sampling run."""
    wall = F / sampling["env_steps_per_s"]  # steady seconds between fragments: one worker's cycle
    tb = sampling["time_breakdown_s"]
    n = sampling["env_steps_total"] / F  # fragments the breakdown's totals cover (the whole run)
    env_s, timed_infer = tb.get("env_s", 0.0) / n, tb.get("inference_s", 0.0) / n
    overhead = {"building_s": timed_infer - act_s * F,  # the worker's act timer also runs over postprocess
                "weight_pull_s": tb.get("pull_s", 0.0) / n,
                "transfer_gap_s": tb.get("worker_idle_s", 0.0) / n}
    # What no timer covers (Ray's per-call work in the worker; the steady window against whole-run means).
    overhead["other_s"] = wall - env_s - act_s * F - sum(overhead.values())
    cpu = sampling["cpu_per_s"]
    return {"env_step_s": env_s / F, "inference_s_per_obs": act_s, "fragment_overhead_s": overhead,
            "worker_cpu_s": cpu.get("worker", 0.0) * wall,
            "transfer_cpu_s": {k: v * wall for k, v in cpu.items() if k != "worker"}}


def costs_from(sampling: dict, learning: dict, cfg, act_s: float) -> dict:
    """Per-fragment and per-update costs from the 1-worker runs (the model's only inputs)."""
    F = cfg.env.num_envs * cfg.rollout.fragment_length
    k = cfg.learner.batch_size / cfg.replay.samples_per_insert
    c = {"fragment_steps": F, "env_steps_per_update": k, **fragment_costs(sampling, F, act_s)}
    c["worker_wall_s"] = worker_wall(c)
    frag_cpu = c["worker_cpu_s"] + sum(c["transfer_cpu_s"].values())
    lcpu, u = learning["cpu_per_s"], learning["updates_per_s"]
    # What an update costs the other processes beyond the k env steps it stands for: the replay server
    # sampling its batch and taking its priorities, the batch's transfer.
    others = sum(v for key, v in lcpu.items() if key != "learner") / u
    c.update(update_learner_cpu_s=lcpu.get("learner", 0.0) / u,
             update_learner_wall_s=(1.0 - learning["learner_wait_frac"]) / u,
             update_replay_cpu_s=max(0.0, others - k * frag_cpu / F))
    return c


def worker_wall(c: dict) -> float:
    """The worker term, built from its parts so a cut in any one of them shows in the prediction."""
    F = c["fragment_steps"]
    return c["env_step_s"] * F + c["inference_s_per_obs"] * F + sum(c["fragment_overhead_s"].values())


def predict(c: dict, workers: int, cores: int) -> dict:
    F, k = c["fragment_steps"], c["env_steps_per_update"]
    frag_cpu = c["worker_cpu_s"] + sum(c["transfer_cpu_s"].values())
    sampling = {"workers": workers / worker_wall(c), "cores": cores / frag_cpu}
    s_bound = min(sampling, key=sampling.get)
    per_update_cpu = c["update_learner_cpu_s"] + c["update_replay_cpu_s"] + k * frag_cpu / F
    learning = {"learner": 1.0 / c["update_learner_wall_s"], "cores": cores / per_update_cpu,
                "workers": sampling[s_bound] * F / k}
    l_bound = min(learning, key=learning.get)
    return {"sampling_env_steps_per_s": sampling[s_bound] * F, "sampling_bound": s_bound,
            "updates_per_s": learning[l_bound], "env_steps_per_s": learning[l_bound] * k, "learning_bound": l_bound}


def saturation(c: dict, cores: int) -> dict:
    """Where the learner saturates: the fewest workers whose fragments feed it as fast as it can update
    (cores aside), and whether the cores bind before it does (then it never saturates here)."""
    F, k = c["fragment_steps"], c["env_steps_per_update"]
    learner = 1.0 / c["update_learner_wall_s"]
    frag_cpu = c["worker_cpu_s"] + sum(c["transfer_cpu_s"].values())
    cores_bound = cores / (c["update_learner_cpu_s"] + c["update_replay_cpu_s"] + k * frag_cpu / F)
    return {"learner_updates_per_s": learner, "workers_to_saturate": math.ceil(learner * k / F * worker_wall(c)),
            "cores_bind_first": cores_bound < learner, "cores_updates_per_s": cores_bound}


def cluster_runs(config: str, nodes: int, workers: int, seconds: float) -> list[dict]:
    """Sampling-only and learning runs on a fresh local cluster of `nodes` nodes, workers spread."""
    import ray
    from ray.cluster_utils import Cluster

    from distrl.runtime.ray_setup import SYSTEM_CONFIG

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": workers + 2, "include_dashboard": False,
                                                            "_system_config": SYSTEM_CONFIG})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=workers + 2)
    cluster.wait_for_nodes()
    try:
        spread = ["placement.workers_strategy=spread"]
        return [{"nodes": nodes, **one_run(config, workers, seconds, learn, cluster.address, spread)}
                for learn in (False, True)]
    finally:
        ray.shutdown()
        cluster.shutdown()


def _t(s: float) -> str:
    """A duration in the unit that keeps three digits readable."""
    return f"{s * 1e6:.2f} µs" if abs(s) < 1e-3 else f"{s * 1e3:.2f} ms"


def costs_table(c: dict) -> str:
    """The per-role costs, each with its share of the term it belongs to: what to cut first."""
    F, k = c["fragment_steps"], c["env_steps_per_update"]
    wall, o = c["worker_wall_s"], c["fragment_overhead_s"]
    xfer = sum(c["transfer_cpu_s"].values())
    frag_cpu = c["worker_cpu_s"] + xfer
    upd_cpu = c["update_learner_cpu_s"] + c["update_replay_cpu_s"] + k * frag_cpu / F
    W, CF, CU = "wall per fragment", "CPU per fragment", "CPU per update"
    # (role, cost, per, time, its part of the term named last: x F for a per-step or per-obs cost)
    rows = [("worker", "env step", "env step", c["env_step_s"], F * c["env_step_s"], W),
            ("worker", "inference (policy.act)", "obs", c["inference_s_per_obs"], F * c["inference_s_per_obs"], W),
            ("worker", "building the fragment (n-step, priorities)", "fragment", o["building_s"], None, W),
            ("worker", "weight pull", "fragment", o["weight_pull_s"], None, W),
            ("transfer", "gap between calls (fragment out, gather, next call)", "fragment", o["transfer_gap_s"], None, W),
            ("worker", "other (Ray's per-call work; window vs run means)", "fragment", o["other_s"], None, W),
            ("worker", f"= wall: env step x {F} + inference x {F} + overhead", "fragment", wall, None, W),
            ("worker", "CPU (its Ray threads included)", "fragment", c["worker_cpu_s"], None, CF),
            ("transfer", "CPU elsewhere (driver, replay, raylet, GCS, idle learner)", "fragment", xfer, None, CF),
            ("learner", "update, busy", "update", c["update_learner_wall_s"], None, None),
            ("learner", "update, CPU", "update", c["update_learner_cpu_s"], None, CU),
            ("replay", "update, CPU elsewhere (sampling, priorities, transfer)", "update", c["update_replay_cpu_s"], None, CU),
            ("workers", f"the {k:g} env steps an update stands for, CPU", "update", k * frag_cpu / F, None, CU)]
    total = {W: wall, CF: frag_cpu, CU: upd_cpu}
    lines = ["| role | cost | per | time | share |", "|---|---|---|---|---|"]
    for role, what, per, s, part, of in rows:
        share = f"{(s if part is None else part) / total[of]:.0%} of {of}" if of else ""
        lines.append(f"| {role} | {what} | {per} | {_t(s)} | {share} |")
    return "\n".join(lines)


def _pct(pred: float, meas: float) -> str:
    return f" ({(pred - meas) / meas:+.0%})" if meas else ""


def prediction_table(out: dict) -> str:
    """Prediction against measurement: every worker count on one node, then the node runs."""
    pred = {int(w): p for w, p in out["predictions"].items()}
    by = {(r["workers"], r["learn"], r.get("nodes")): r for r in out["runs"] + out["nodes"]}
    lines = ["| workers | nodes | sampling pred. | meas. | learning env steps/s pred. | meas. | updates/s pred. "
             "| meas. | bound (sampling / learning) |", "|---|---|---|---|---|---|---|---|---|"]
    keys = [(w, None) for w in sorted(pred)] + [(r["workers"], r["nodes"]) for r in out["nodes"] if not r["learn"]]
    for w, nodes in keys:
        p, s, lr = pred.get(w), by.get((w, False, nodes)), by.get((w, True, nodes))
        if p is None or s is None or lr is None:
            continue
        fit = " (fit)" if w == 1 and nodes is None else _pct(p["sampling_env_steps_per_s"], s["env_steps_per_s"])
        lines.append(f"| {w} | {nodes if nodes else '1'}{' (cluster)' if nodes == 1 else ''} "
                     f"| {p['sampling_env_steps_per_s']:,.0f}{fit} | {s['env_steps_per_s']:,.0f} "
                     f"| {p['env_steps_per_s']:,.0f}{_pct(p['env_steps_per_s'], lr['env_steps_per_s'])} "
                     f"| {lr['env_steps_per_s']:,.0f} | {p['updates_per_s']:,.0f}{_pct(p['updates_per_s'], lr['updates_per_s'])} "
                     f"| {lr['updates_per_s']:,.0f} | {p['sampling_bound']} / {p['learning_bound']} |")
    return "\n".join(lines)


def show(out: dict) -> None:
    sat = out["saturation"]
    print("\nPer-role costs (1-worker runs):\n\n" + costs_table(out["costs"]))
    print(f"\nThe learner saturates at {sat['learner_updates_per_s']:.0f} updates/s, fed by "
          f"{sat['workers_to_saturate']} worker(s); the cores allow {sat['cores_updates_per_s']:.0f}"
          f"{' and bind first' if sat['cores_bind_first'] else ''}.")
    print("\nPrediction against measurement (env steps/s; fitted on 1 worker):\n\n" + prediction_table(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--nodes", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "model.json"))
    ap.add_argument("--show", metavar="JSON", help="print the tables of a measured JSON and exit")
    args = ap.parse_args()
    if args.show:
        with open(args.show) as fh:
            return show(json.load(fh))
    import ray

    from distrl.config import load_config

    cfg, cores = load_config(args.config), os.cpu_count()
    out = {"command": "python -m bench.model " + " ".join(sys.argv[1:]), "hardware": hardware(),
           "config": os.path.relpath(args.config, ROOT), "runs": [], "nodes": []}
    act_s = act_s_per_obs(args.config)  # before any run: the cores are this process's alone
    for w in sorted(set(args.workers) | {1}):
        for learn in (False, True):
            out["runs"].append(one_run(args.config, w, args.seconds, learn))
            print(f"{w} worker(s), learn {learn}: {out['runs'][-1]['env_steps_per_s']:.0f} env steps/s, "
                  f"{out['runs'][-1]['updates_per_s']:.0f} updates/s", flush=True)
    ray.shutdown()
    by = {(r["workers"], r["learn"]): r for r in out["runs"]}
    out["costs"] = c = costs_from(by[(1, False)], by[(1, True)], cfg, act_s)
    out["predictions"] = {w: predict(c, w, cores) for w in sorted(set(args.workers))}
    out["saturation"] = saturation(c, cores)
    for n in args.nodes:
        out["nodes"] += cluster_runs(args.config, n, max(args.workers), args.seconds)
        print(f"{n} node(s): {[round(r['env_steps_per_s']) for r in out['nodes'][-2:]]} env steps/s", flush=True)
    write_json(args.out, out)
    show(out)


if __name__ == "__main__":
    main()
