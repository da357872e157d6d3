"""What the role processes cost to start and to keep: actor start-up time and resident memory per role.

    python -m bench.processes [--config configs/apex_dqn_cartpole.yaml] [--against REV] [--repeats 3]

Each repeat starts one embedded Ray in a fresh process (its start-up timed apart), then builds the
sync-mode roles (`RayRoles`: parameter server, replay server, learner, evaluator, two workers) and
times that until every actor answers and the learner has published version 0: the actor start-up.
The workers then sample for `--seconds`, and the resident set (VmRSS) of every actor process is read
from /proc. `--against REV` runs the same measurement with the distrl of that git revision (a
worktree under bench/out/), repeats alternating, so both see the same machine load. JSON:
bench/results/processes.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench.common import ROOT, hardware, write_json
from bench.solve import alternating, sides

PROBE = r"""
import json, os, sys, tempfile, time
import ray
from distrl.config import load_config
from distrl.runtime.ray_roles import RayRoles
from distrl.runtime.ray_setup import init_ray

cfg = load_config(sys.argv[1], ["mode=sync", "workers=2", "log.tensorboard=false"])
t0 = time.time()
init_ray(None)
t1 = time.time()
roles = RayRoles(cfg, tempfile.mkdtemp(), time.time())
t2 = time.time()
end = t2 + float(sys.argv[2])
while time.time() < end:
    roles.gather(True)
def rss_mb(pid):
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024.0
names = {id(roles.learner): "learner", id(roles.evaluator): "evaluator", id(roles.replay): "replay",
         id(roles.ps): "parameter_server"}
rss = {}
for actor in roles.actors():
    name = names.get(id(actor), "worker")
    rss.setdefault(name, []).append(rss_mb(ray.get(actor.pid.remote())))
roles.close()
print("RESULT " + json.dumps({"ray_start_s": t1 - t0, "actor_startup_s": t2 - t1,
                              "rss_mb": {k: max(v) for k, v in rss.items()}}))
"""


def measure(tree: str, config: str, seconds: float) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, os.path.join(tree, config), str(seconds)],
                          capture_output=True, text=True, cwd=tree, env={**os.environ, "PYTHONPATH": tree})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"probe failed in {tree}:\n{proc.stderr[-2000:]}")
    return json.loads(line[len("RESULT "):])


def summarise(runs: list[dict]) -> dict:
    med = lambda xs: round(statistics.median(xs), 2)  # noqa: E731
    roles = runs[0]["rss_mb"].keys()
    return {"ray_start_s": med([r["ray_start_s"] for r in runs]),
            "actor_startup_s": med([r["actor_startup_s"] for r in runs]),
            "rss_mb": {k: med([r["rss_mb"][k] for r in runs]) for k in roles}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join("configs", "apex_dqn_cartpole.yaml"))
    ap.add_argument("--against", metavar="REV")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="sampling before the memory is read")
    args = ap.parse_args()
    runs = alternating(sides(args.against), args.repeats, lambda tree: measure(tree, args.config, args.seconds))
    results = {"hardware": hardware(), "config": args.config, "runs": runs,
               "median": {side: summarise(r) for side, r in runs.items()}}
    write_json(os.path.join(ROOT, "bench", "results", "processes.json"), results)
    for side, m in results["median"].items():
        print(side, json.dumps(m))


if __name__ == "__main__":
    main()
