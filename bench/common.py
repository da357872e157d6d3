"""Helpers shared by the benchmarks: hardware description, steady-state rates, JSON output."""
from __future__ import annotations

import csv
import json
import os
import platform
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hardware() -> dict:
    model = "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    import torch

    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "gpu": torch.cuda.is_available(), "commit": measured_commit()}


def measured_commit() -> str | None:
    """The commit whose code ran, '+dirty' when distrl/ or bench/ (results aside) had uncommitted changes."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    sha = git("rev-parse", "--short", "HEAD")
    return (sha + ("+dirty" if git("status", "--porcelain", "--", "distrl", "bench", ":!bench/results") else "")) if sha else None


def steady_rates(run_dir: str, warmup_s: float = 2.0) -> dict:
    """env steps/s and updates/s between the first row after warm-up and the last row."""
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    rows = [r for r in rows if float(r["wall_s"]) > 0]
    first_active = next((i for i, r in enumerate(rows) if int(r["env_steps"]) > 0), 0)
    t0 = float(rows[first_active]["wall_s"]) + warmup_s
    window = [r for r in rows[first_active:] if float(r["wall_s"]) >= t0] or rows[-2:]
    a, b = window[0], window[-1]
    dt = max(float(b["wall_s"]) - float(a["wall_s"]), 1e-9)
    return {"env_steps_per_s": (int(b["env_steps"]) - int(a["env_steps"])) / dt,
            "updates_per_s": (int(b["updates"]) - int(a["updates"])) / dt, "window_s": dt}


def write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2)
    print(f"wrote {path}")


def checked_run(cmd: list[str], what: str) -> str:
    """`cmd`'s stdout (run from the repository's root); a failure ends the benchmark with its stderr's tail."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return proc.stdout


def json_result(cmd: list[str], what: str) -> dict:
    """The JSON line a child benchmark prints last."""
    return json.loads(checked_run(cmd, what).strip().splitlines()[-1])
