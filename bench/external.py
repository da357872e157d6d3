"""Env steps/s through the simulator server, against the same config's own rollout workers.

    python -m bench.external [--config configs/apex_dqn_cartpole.yaml] [--clients 1 2 4] [--seconds 15]
                             [--client-envs 1] [--send-steps N] [--kinds workers workers_1env remote local]

Per count N, four async-mode runs of the config (`--kinds`): N client processes (`bench.external_sim`,
each one gymnasium env as a simulator would have, or `--client-envs` K side by side acting through
`Client.get_actions`) with remote inference, and with local inference; N own workers with the config's
`env.num_envs`; and N own workers with one env each (what a one-env client has). Ratios are over the own workers of the same N. Each run's rate is its steady state from
metrics.csv over `--seconds` after a warm-up (then a clean stop). For a replay config the runs sample
only (a replay minimum out of reach: the learner never trains, nothing holds the sources back); an
on-policy config's runs learn (PPO's: the rate with its learner on, to set beside RLlib's external-env
example, bench/peers/rllib_external.py), each update as large with N clients as with N own workers: the
server is one fragment source, so its runs take `learner.fragments_per_update=N` (unless the config sets it).
"""
from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time

from bench.common import ROOT, hardware, measured_commit, steady_rates, write_json

CONFIG = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
WARMUP_S = 3.0  # sampling seconds left out of the rate: processes starting, weights arriving
COMMON = ["eval.target_return=null", "log.progress=false", "log.interval_s=0.5", "eval.interval_s=30", "mode=async"]
KINDS = ("workers", "workers_1env", "remote", "local")  # the runs per count: own workers, and clients
SAMPLING_ONLY = ["replay.capacity=3000000", "replay.min_size=3000000"]  # a replay minimum out of reach: no learning


def run(config: str, seconds: float, overrides: list[str], clients: int = 0, inference: str = "remote",
        client_args: tuple[str, ...] = ()) -> dict:
    run_dir = tempfile.mkdtemp(prefix="bench-external-")
    os.rmdir(run_dir)
    cmd = [sys.executable, "-m", "distrl.cli", "train", config, "--run-dir", run_dir, "--max-seconds", "900",
           *[f"--set={o}" for o in COMMON + (SAMPLING_ONLY if replayed(config) else []) + overrides]]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sims = simulators(run_dir, proc, clients, inference, client_args) if clients else []
    try:
        sampled_for(run_dir, proc, WARMUP_S + seconds)
        proc.send_signal(signal.SIGINT)  # a clean stop: the summary is written
        _, err = proc.communicate(timeout=120)
        if proc.returncode not in (0, 130):
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-2000:]}")
    finally:
        for s in sims:
            s.kill()
            s.wait()
        if proc.poll() is None:
            proc.kill()
    return steady_rates(run_dir, warmup_s=WARMUP_S)


def simulators(run_dir: str, proc: subprocess.Popen, clients: int, inference: str,
               extra: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    """`clients` simulator processes, started once the run's server listens (its start-up, under load, varies)."""
    while not os.path.exists(os.path.join(run_dir, "external.json")):
        if proc.poll() is not None:
            raise SystemExit(f"the run in {run_dir} ended before its server started: {proc.stderr.read()[-2000:]}")
        time.sleep(0.1)
    return [subprocess.Popen([sys.executable, "-m", "bench.external_sim", run_dir, "--seconds", "100000",
                              "--seed", str(i), "--inference", inference, "--reconnect", "2", *extra],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for i in range(clients)]


def replayed(config: str) -> bool:
    from distrl.config import load_config
    from distrl.registry import algorithm

    return algorithm(load_config(config).algo).data_path == "replay"


def same_update(config: str, n: int) -> list[str]:
    """For an on-policy config, what makes a server's update the size of N own workers' (async mode takes
    one fragment per source, and a server is one source): `learner.fragments_per_update` = N, unless
    the config sets its own."""
    from distrl.config import load_config
    from distrl.registry import on_policy

    cfg = load_config(config)
    return [] if not on_policy(cfg.algo) or cfg.learner.fragments_per_update else [f"learner.fragments_per_update={n}"]


def sampled_for(run_dir: str, proc: subprocess.Popen, seconds: float, timeout_s: float = 600.0) -> None:
    """Wait until the run's metrics rows span `seconds` of sampling (start-up, under load, varies)."""
    path, deadline = os.path.join(run_dir, "metrics.csv"), time.time() + timeout_s
    while proc.poll() is None:
        if time.time() > deadline:
            raise SystemExit(f"the run in {run_dir} sampled for less than {seconds:g} s in {timeout_s:g} s")
        time.sleep(0.5)
        rows = list(csv.DictReader(open(path))) if os.path.exists(path) else []
        active = [float(r["wall_s"]) for r in rows if int(r["env_steps"]) > 0]
        if active and active[-1] - active[0] >= seconds:
            return


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--client-envs", type=int, default=1,
                   help="envs each client steps side by side, acting through Client.get_actions")
    p.add_argument("--send-steps", type=int, default=None,
                   help="local inference: steps per experience message (default: the client's)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="which runs per count")
    p.add_argument("--out", default=None,
                   help="default bench/results/external_<config name>[_envs<K>].json")
    a = p.parse_args(argv)
    rows = []
    client_args = ("--envs", str(a.client_envs), *(("--send-steps", str(a.send_steps)) if a.send_steps else ()))
    for n in a.clients:
        runs = {"workers": lambda: run(a.config, a.seconds, [f"workers={n}"]),
                "workers_1env": lambda: run(a.config, a.seconds, [f"workers={n}", "env.num_envs=1"]),
                **{mode: (lambda mode=mode: run(a.config, a.seconds, ["external.enabled=true", *same_update(a.config, n)],
                                                n, mode, client_args))
                   for mode in ("remote", "local")}}
        steps = {k: runs[k]()["env_steps_per_s"] for k in a.kinds}
        row = {"n": n, "client_envs": a.client_envs, "send_steps": a.send_steps, **steps,
               **{f"{c}_vs_{w}": steps[c] / steps[w] for c in ("remote", "local") for w in ("workers", "workers_1env")
                  if c in steps and w in steps}}
        print(row, flush=True)
        rows.append(row)
    name = os.path.splitext(os.path.basename(a.config))[0] + (f"_envs{a.client_envs}" if a.client_envs > 1 else "") \
        + (f"_send{a.send_steps}" if a.send_steps else "")
    write_json(a.out or os.path.join(ROOT, "bench", "results", f"external_{name}.json"),
               {"config": os.path.relpath(a.config, ROOT), "seconds": a.seconds, "client_envs": a.client_envs,
                "rows": rows, "hardware": hardware(), "commit": measured_commit()})


if __name__ == "__main__":
    main()
