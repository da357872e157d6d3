"""Memory soak: RSS of every role over a long async run with a Learner and a ParameterServer SIGKILLed
inside it, that nothing was lost, and the cost of a 1M-transition checkpoint.

    python -m bench.soak [--minutes 30] [--config configs/apex_dqn_cartpole.yaml] [--no-kills]

Growth per role = (end - after warm-up) / after warm-up, warm-up being the
first quarter of the run (the replay fills, allocators settle); each end is the
median of one minute of samples (6), since one sample can catch a block in flight. Reported for
RSS and for its two moving parts: private memory (RssAnon: the process's own
heap, where a leak shows) and shared object-store pages (RssShmem: pages of
Ray's plasma arena the process has touched, owned by the object store and
bounded by its size).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench.common import ROOT, hardware, write_json

ROLES = ("RolloutWorker", "Learner", "ReplayServer", "ParameterServer", "Evaluator")


KINDS = {"VmRSS:": "rss", "RssAnon:": "private", "RssShmem:": "shared"}


def memory_mb(pid: int) -> dict[str, float]:
    """RSS, private (anonymous) and shared-memory resident MB of one process; zeros if it is gone."""
    out = dict.fromkeys(KINDS.values(), 0.0)
    try:
        for line in open(f"/proc/{pid}/status"):
            key = line.split(":", 1)[0] + ":"
            if key in KINDS:
                out[KINDS[key]] = int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return out


def total_mb(pids: list[int]) -> dict[str, float]:
    per_pid = [memory_mb(p) for p in pids]
    return {kind: round(sum(m[kind] for m in per_pid), 1) for kind in KINDS.values()}


def _descends_from(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def role_pids(root: int | None = None) -> dict[str, list[int]]:
    """Each role's processes; with `root`, only those started by that run (Ray's processes descend from it)."""
    out = {}
    for role in ROLES:
        res = subprocess.run(["pgrep", "-f", f"ray::{role}"], capture_output=True, text=True).stdout
        out[role] = sorted(int(p) for p in res.split() if root is None or _descends_from(int(p), root))
    return out


def checkpoint_cost(transitions: int = 1_000_000) -> dict:
    """Write and read a whole-run checkpoint holding a full CartPole-shaped prioritized replay."""
    from distrl.replay import ReplayBuffer
    from distrl.checkpoint.run import checkpoint_size, read_checkpoint, write_checkpoint

    buf = ReplayBuffer(transitions, prioritized=True)
    rng = np.random.default_rng(0)
    chunk = 100_000
    for _ in range(transitions // chunk):
        buf.add({"obs": rng.normal(size=(chunk, 4)).astype(np.float32), "actions": rng.integers(0, 2, chunk),
                 "rewards": np.ones(chunk, np.float32), "next_obs": rng.normal(size=(chunk, 4)).astype(np.float32),
                 "discounts": np.full(chunk, 0.97, np.float32), "version": np.zeros(chunk, np.int32)},
                rng.random(chunk))
    run_dir = tempfile.mkdtemp(prefix="ckpt-bench-")
    import torch

    state = {"meta": {"note": "bench"}, "learner": {"w": torch.zeros(64, 64)}, "store": buf.state_dict(),
             "workers": [], "torch_rng": None, "numpy_rng": None}
    t0 = time.perf_counter()
    path = write_checkpoint(run_dir, state)
    t1 = time.perf_counter()
    read_checkpoint(path)
    t2 = time.perf_counter()
    return {"transitions": transitions, "size_mb": round(checkpoint_size(path) / 1e6, 1),
            "write_s": round(t1 - t0, 3), "read_s": round(t2 - t1, 3)}


# (fraction of the run, role). Before warm-up ends at 0.25: growth is then measured on the processes that run
# the rest of the run (a restarted one is fresh, and would otherwise show its own warm-up as growth).
KILLS = {0.10: "Learner", 0.15: "ParameterServer"}


def kill_role(name: str, root: int) -> int | None:
    pids = role_pids(root).get(name) or []
    if pids:
        os.kill(pids[0], signal.SIGKILL)
    return pids[0] if pids else None


def nothing_lost(run_dir: str) -> dict:
    """What the kills could have lost, checked: env steps never went back in metrics.csv; the final checkpoint
    holds the summary's counters and a replay that hashes as recorded; and a resume from it (every process
    new) restores those counters and that replay hash in the new replay server (`resumes.jsonl`)."""
    import csv
    import json

    from distrl.checkpoint.run import load_latest
    from distrl.replay.store import digest

    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    steps = [int(r["env_steps"]) for r in csv.DictReader(open(os.path.join(run_dir, "metrics.csv")))]
    path, state = load_latest(run_dir)
    counters, recorded = state["meta"]["counters"], state["meta"]["store_sha256"]
    wall = state["meta"]["wall_s"]
    subprocess.run([sys.executable, "-m", "distrl.cli", "resume", run_dir, "--max-seconds", str(wall + 20),
                    "--set", "log.progress=false"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    resumed = [json.loads(line) for line in open(os.path.join(run_dir, "resumes.jsonl"))][-1]
    checks = {
        "env_steps_never_went_back": all(b >= a for a, b in zip(steps, steps[1:])),
        "checkpoint_holds_the_summary_counters": (counters["env_steps"], counters["updates"]) ==
                                                 (summary["env_steps"], summary["updates"]),
        "checkpoint_replay_hash_as_recorded": digest(state["store"]) == recorded,
        "resume_restored_the_counters": (resumed["env_steps"], resumed["updates"]) ==
                                        (counters["env_steps"], counters["updates"]),
        "resume_restored_the_replay_hash": resumed["store_sha256"] == recorded,
    }
    return {"ok": all(checks.values()), **checks, "checkpoint": path, "env_steps": counters["env_steps"],
            "updates": counters["updates"], "store_sha256": recorded,
            "learner_restarts": summary["learner_restarts"], "parameter_server_restarts": summary["parameter_server_restarts"],
            "updates_lost": summary["updates_lost"], "failure": summary["failure"]}


def soak(config: str, minutes: float, interval_s: float = 10.0, kills: bool = True) -> dict:
    run_dir = tempfile.mkdtemp(prefix="soak-")
    os.rmdir(run_dir)
    cmd = [sys.executable, "-m", "distrl.cli", "train", config, "--mode", "async", "--run-dir", run_dir,
           "--max-seconds", str(minutes * 60 + 30), "--set", "eval.target_return=null",
           "--set", "log.progress=false", "--set", "eval.interval_s=5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []  # (t, {role: total MB})
    pending = dict(KILLS) if kills else {}
    killed = []
    metrics = os.path.join(run_dir, "metrics.csv")
    while proc.poll() is None and not (os.path.exists(metrics) and len(open(metrics).readlines()) > 1):
        time.sleep(0.5)  # the clock starts once every role is up and the run logs
    t_start = time.time()
    try:
        while time.time() - t_start < minutes * 60 and proc.poll() is None:
            time.sleep(interval_s)
            for frac, name in sorted(pending.items()):
                if time.time() - t_start >= frac * minutes * 60:
                    killed.append((round(time.time() - t_start, 1), name, kill_role(name, proc.pid)))
                    del pending[frac]
            pids = role_pids(proc.pid)
            row = {role: total_mb(ps) for role, ps in pids.items()}
            row["driver"] = total_mb([proc.pid])
            samples.append((round(time.time() - t_start, 1), row))
            print(samples[-1], flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    return {"minutes": minutes, "samples": samples, "killed": killed, "growth": growth(samples, minutes * 60 / 4),
            "nothing_lost": nothing_lost(run_dir)}


def growth(samples: list, warm_t: float, window: int = 6) -> dict:
    """Per role and kind: median of `window` samples at the end of warm-up vs the last `window`."""
    warm = next(i for i, (t, _) in enumerate(samples) if t >= warm_t)
    out = {}
    for role in samples[0][1]:
        out[role] = {}
        for kind in KINDS.values():
            base = float(np.median([row[role][kind] for _, row in samples[warm:warm + window]]))
            last = float(np.median([row[role][kind] for _, row in samples[-window:]]))
            out[role][kind] = {"mb_after_warmup": round(base, 1), "mb_last": round(last, 1),
                               "growth_pct": round(100.0 * (last - base) / base, 2) if base else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "soak.json"))
    ap.add_argument("--no-kills", action="store_true", help="no Learner / ParameterServer kill inside the run")
    args = ap.parse_args()
    results = {"hardware": hardware(), "checkpoint": checkpoint_cost()}
    print(results["checkpoint"], flush=True)
    results.update(soak(args.config, args.minutes, kills=not args.no_kills))
    print(results["killed"], results["nothing_lost"], flush=True)
    write_json(args.out, results)
    print("| role | RSS after warm-up → end (MB) | RSS growth | private after warm-up → end (MB) | private growth"
          " | object-store pages after warm-up → end (MB) |\n|---|---|---|---|---|---|")
    for role, g in results["growth"].items():
        rss, priv, shm = g["rss"], g["private"], g["shared"]
        print(f"| {role} | {rss['mb_after_warmup']} → {rss['mb_last']} | {rss['growth_pct']}% "
              f"| {priv['mb_after_warmup']} → {priv['mb_last']} | {priv['growth_pct']}% "
              f"| {shm['mb_after_warmup']} → {shm['mb_last']} |")


if __name__ == "__main__":
    main()
