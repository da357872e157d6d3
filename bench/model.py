"""A paper model of distributed throughput from per-role costs, against measured runs.

    python -m bench.model [--config configs/apex_dqn_cartpole.yaml] [--workers 1 2 4] [--nodes 1 2 3]
                          [--seconds 15]

1. Costs, measured on a 1-worker async run (sampling only, then learning): the CPU seconds every
   process of the run spends (read from /proc over a steady window), per fragment of F env steps and
   per learner update, by role: the worker (env steps, inference, building the fragment, Ray's
   per-call work), the learner, and everything else that handles a fragment (driver, replay server,
   parameter server, the raylet and GCS, the evaluator). Plus the worker's wall time per fragment,
   its CPU time plus its wait for Ray between two calls; and per update, the learner's CPU and busy wall
   time and what the other processes spend on it beyond its env steps (replay CPU: sampling the batch,
   its priorities, its transfer).
2. The model, with W workers on C cores (all Ray nodes of this machine share its cores):
      sampling only:  fragments/s = min(W / worker wall, C / (worker CPU + rest CPU))
      learning:       updates/s  = min(1 / learner wall, C / (learner CPU + replay CPU + k (worker CPU + rest CPU) / F),
                                       fragments/s x F / k)
   where k = batch_size / samples_per_insert env steps per update (the rate limiter's ratio); env
   steps/s = k x updates/s. The bound that is smallest names what saturates: the workers, the cores,
   or the learner (more workers then add nothing).
3. Measurements: the same runs with W = 1, 2, 4, and with 4 workers spread over a local Ray cluster of
   1-3 nodes (`ray.cluster_utils.Cluster`) on this machine. The model is fitted on W = 1 only.
"""
from __future__ import annotations

import argparse
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
    """An async run: steady env steps/s and updates/s, CPU seconds by role per second, worker idle share."""
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
            "learner_wait_frac": tb.get("learner_wait_s", 0.0) / wall, "steady": steady_rates(run_dir)}


def costs_from(sampling: dict, learning: dict, cfg) -> dict:
    """Per-fragment and per-update costs from the 1-worker runs (the model's only inputs)."""
    F = cfg.env.num_envs * cfg.rollout.fragment_length
    per_frag = F / sampling["env_steps_per_s"]  # seconds between fragments: one worker's cycle
    cpu = sampling["cpu_per_s"]
    rest = sum(v for k, v in cpu.items() if k != "worker")  # driver, replay, raylet, GCS, polling learner
    lcpu, u = learning["cpu_per_s"], learning["updates_per_s"]
    k = cfg.learner.batch_size / cfg.replay.samples_per_insert
    worker_cpu, rest_cpu = cpu.get("worker", 0.0) * per_frag, rest * per_frag
    # What an update costs the other processes beyond the k env steps it stands for: the replay server
    # sampling its batch and taking its priorities, the batch's transfer.
    others = sum(v for key, v in lcpu.items() if key != "learner") / u
    return {"fragment_steps": F, "worker_wall_s": per_frag, "worker_cpu_s": worker_cpu, "rest_cpu_s": rest_cpu,
            "learner_cpu_s": lcpu.get("learner", 0.0) / u,
            "learner_wall_s": (1.0 - learning["learner_wait_frac"]) / u,
            "per_update_rest_cpu_s": max(0.0, others - k * (worker_cpu + rest_cpu) / F),
            "env_steps_per_update": k}


def predict(c: dict, workers: int, cores: int) -> dict:
    F, k = c["fragment_steps"], c["env_steps_per_update"]
    frag_cpu = c["worker_cpu_s"] + c["rest_cpu_s"]
    sampling = {"workers": workers / c["worker_wall_s"], "cores": cores / frag_cpu}
    s_bound = min(sampling, key=sampling.get)
    per_update_cpu = c["learner_cpu_s"] + c["per_update_rest_cpu_s"] + k * frag_cpu / F
    learning = {"learner": 1.0 / c["learner_wall_s"], "cores": cores / per_update_cpu,
                "workers": sampling[s_bound] * F / k}
    l_bound = min(learning, key=learning.get)
    return {"sampling_env_steps_per_s": sampling[s_bound] * F, "sampling_bound": s_bound,
            "updates_per_s": learning[l_bound], "env_steps_per_s": learning[l_bound] * k, "learning_bound": l_bound}


def cluster_runs(config: str, nodes: int, workers: int, seconds: float) -> list[dict]:
    """Sampling-only and learning runs on a fresh local cluster of `nodes` nodes, workers spread."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": workers + 2, "include_dashboard": False})
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--nodes", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "model.json"))
    args = ap.parse_args()
    import ray

    from distrl.config import load_config

    cfg, cores = load_config(args.config), os.cpu_count()
    out = {"command": "python -m bench.model " + " ".join(sys.argv[1:]), "hardware": hardware(),
           "config": os.path.relpath(args.config, ROOT), "runs": [], "nodes": []}
    for w in sorted(set(args.workers) | {1}):
        for learn in (False, True):
            out["runs"].append(one_run(args.config, w, args.seconds, learn))
            print(f"{w} worker(s), learn {learn}: {out['runs'][-1]['env_steps_per_s']:.0f} env steps/s, "
                  f"{out['runs'][-1]['updates_per_s']:.0f} updates/s", flush=True)
    ray.shutdown()
    by = {(r["workers"], r["learn"]): r for r in out["runs"]}
    out["costs"] = c = costs_from(by[(1, False)], by[(1, True)], cfg)
    out["predictions"] = {w: predict(c, w, cores) for w in args.workers}
    for n in args.nodes:
        out["nodes"] += cluster_runs(args.config, n, max(args.workers), args.seconds)
        print(f"{n} node(s): {[round(r['env_steps_per_s']) for r in out['nodes'][-2:]]} env steps/s", flush=True)
    write_json(args.out, out)
    print(f"{'workers':>8}{'sampling pred':>15}{'meas':>9}{'learning pred':>15}{'meas':>9}{'upd/s pred':>12}"
          f"{'meas':>8}  bound")
    for w in args.workers:
        p, s, lr = out["predictions"][w], by[(w, False)], by[(w, True)]
        print(f"{w:>8}{p['sampling_env_steps_per_s']:>15.0f}{s['env_steps_per_s']:>9.0f}{p['env_steps_per_s']:>15.0f}"
              f"{lr['env_steps_per_s']:>9.0f}{p['updates_per_s']:>12.0f}{lr['updates_per_s']:>8.0f}  "
              f"{p['sampling_bound']} / {p['learning_bound']}")


if __name__ == "__main__":
    main()
