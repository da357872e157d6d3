"""Chaos run: a seeded schedule of faults against every role of a run, once the driver itself, and what must
hold afterwards.

    python -m bench.chaos --minutes 10 --mode single|sync|async [--seed 0] [--out bench/results/chaos_MODE.json]

Ape-X DQN on CartPole runs for `--minutes` of its own wall time (stop.max_seconds; no target, so the run
ends by its own stop rule), with the shipped fault defaults (only the restart limits are raised, so that a
long run's many faults do not end it). About every 20 s the schedule picks a role (a seeded shuffle of the
roles the mode has: rollout worker, learner, parameter server, replay server, evaluator, inference server,
gradient worker; single mode has only its evaluator process) and SIGKILLs one of its processes, or
SIGSTOPs it for twice the default fault.role_timeout_s (distrl must end it within the timeout; it is
SIGCONTed after, if it is somehow still there). A fault waits until the previous one's restart is in
RUN_DIR/faults.log. Once, between 35% and 55% of the run, the driver is SIGKILLed right after a checkpoint
(what is left of its process tree too) and the run resumed with `distrl resume`; no fault but the first is
injected in the 15 s before that kill is due, so that a restart under way does not hold it back (and
leave the resumed run too little of its budget to start). Faults stop 30 s before the run's end, so that each is
resolved within the run.

Each fault's times are measured: found (the death noticed, or the hang ended) and resolved (the new
process back), from the signal, read off its line in faults.log as that line appears (to within the 0.5 s
at which the driver reads Ray's actor table).

Checked afterwards: the run ended by its own stop rule (max_seconds) with exit status 0 and no failure,
within 10 s of its budget, never hung (a hard limit); env steps and updates never went back across the resume; every checkpoint
written verifies (read as it appears, and again at the end); summary.json's restarts per role equal the
faults injected; the replay restored on resume hashes as its checkpoint recorded, and so does the newest
checkpoint's; metrics.csv is monotonic (updates may fall back only to a checkpoint, where a restarted
learner resumes).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

from bench.chaos_times import FaultLines, fault_times, summarize
from bench.common import ROOT, hardware, write_json
from bench.procfs import descendants, started_at, stat_fields
from distrl.config import FaultConfig

CONFIG = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
ENDED_S = 10.0  # a run has ended this long after its budget at most
STOP_S = 2 * FaultConfig().role_timeout_s  # how long a SIGSTOP lasts: twice the default hang timeout
PERIOD_S = 20.0
QUIET_END_S = 30.0  # no fault this close to the run's end: each is resolved within the run
QUIET_KILL_S = 15.0  # no fault this close before the driver's kill is due: a restart would hold the kill back
# role -> (process title, summary.json key, the label distrl's fault lines start with)
ROLES = {"workers": ("ray::RolloutWorker", "worker_restarts", "worker "),
         "learner": ("ray::Learner", "learner_restarts", "learner "),
         "parameter_server": ("ray::ParameterServer", "parameter_server_restarts", "parameter server "),
         "replay": ("ray::ReplayServer", "replay_restarts", "replay server "),
         "evaluator": ("ray::Evaluator", "evaluator_restarts", "evaluator "),
         "inference": ("ray::InferenceServer", "inference_restarts", "inference server "),
         "gradient_workers": ("ray::GradientWorker", "gradient_worker_restarts", "gradient worker ")}
SINGLE = {"evaluator": ("distrl-eval", "evaluator_restarts", "evaluator ")}


def overrides(mode: str, minutes: float, extra: tuple = ()) -> list[str]:
    sets = [f"mode={mode}", f"stop.max_seconds={minutes * 60:g}", "eval.target_return=null", "eval.interval_s=2",
            "fault.max_role_restarts=100",
            "fault.max_worker_restarts=100", "checkpoint.interval_s=10", "log.progress=false",
            "log.tensorboard=false", "log.interval_s=1"]
    if mode != "single":
        sets += ["workers=2", "learner.num_gradient_workers=2", "rollout.inference=central"]
    return [x for s in [*sets, *extra] for x in ("--set", s)]


# --- processes -------------------------------------------------------------------------------------------
def title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/comm") as fh:
            return f"{fh.read().strip()} {cmd}"
    except OSError:
        return ""


def role_processes(root: int, mark: str, settled_s: float = 10.0) -> list[int]:
    """Running (not stopped) processes of a role under `root`, up for at least `settled_s` (a role still
    starting is not a target: it is not yet a running role)."""
    boot = time.time() - float(open("/proc/uptime").read().split()[0])
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for pid in descendants(root):
        fields = stat_fields(pid)
        names = title(pid).split()  # an actor's title is ray::Class, or ray::Class.method while it runs one
        if len(fields) > 19 and fields[0] != "T" and any(n == mark or n.startswith(mark + ".") for n in names):
            if time.time() - (boot + int(fields[19]) / tick) >= settled_s:
                out.append(pid)
    return out


# --- the run's files ---------------------------------------------------------------------------------------
def events(run_dir: str) -> list[str]:
    path = os.path.join(run_dir, "faults.log")
    if not os.path.exists(path):
        return []
    return [line.split("] distrl: ", 1)[1] for line in open(path).read().splitlines() if "] distrl: " in line]


def metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [r for r in csv.DictReader(fh) if r.get("learner_blocked_frac")]  # whole rows only


def wall(run_dir: str) -> float:
    rows = metrics(run_dir)
    return float(rows[-1]["wall_s"]) if rows else 0.0


class CheckpointWatch(threading.Thread):
    """Verifies every checkpoint as it completes (pruning keeps only the newest few); records each one's
    (wall_s, env_steps, updates)."""

    def __init__(self, run_dir: str):
        super().__init__(daemon=True)
        self.run_dir, self.seen, self.failed, self.done = run_dir, {}, [], threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.scan()

    def scan(self) -> None:
        from distrl.checkpoint import CheckpointError
        from distrl.checkpoint.read import read_checkpoint

        root = os.path.join(self.run_dir, "checkpoints")
        for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            path = os.path.join(root, name)
            if name in self.seen or not name.startswith("ckpt-") or not os.path.exists(os.path.join(path, "DONE")):
                continue
            try:
                meta = read_checkpoint(path)["meta"]
                self.seen[name] = (meta["wall_s"], meta["counters"]["env_steps"], meta["counters"]["updates"])
            except (CheckpointError, OSError) as e:
                if os.path.exists(path):  # not pruned meanwhile: it does not verify
                    self.failed.append(f"{name}: {e}")
                    self.seen[name] = None


# --- faults ------------------------------------------------------------------------------------------------
class Chaos:
    def __init__(self, mode: str, minutes: float, seed: int, run_dir: str):
        self.mode, self.minutes, self.run_dir = mode, minutes, run_dir
        self.roles = SINGLE if mode == "single" else ROLES
        self.rng = random.Random(seed)
        self.faults: list[dict] = []
        self.problems: list[str] = []
        self.driver_kill_at = self.rng.uniform(0.35, 0.55) * minutes * 60
        self.cycle: list[str] = []

    def next_role(self) -> str:
        if not self.cycle:
            self.cycle = list(self.roles)
            self.rng.shuffle(self.cycle)
        return self.cycle.pop()

    def resolved(self) -> bool:
        """Every fault so far has its distrl line (died or hung, restarted) in faults.log."""
        lines = events(self.run_dir)
        for role, (_, _, label) in self.roles.items():
            wanted = sum(f["role"] == role for f in self.faults)
            got = sum(1 for e in lines if e.startswith(label) and ", restarted " in e
                      and not (label == "worker " and e.startswith("gradient")))
            if got < wanted:
                return False
        return True

    def inject(self, root: int) -> None:
        role = self.next_role()
        mark, _, _ = self.roles[role]
        pids = role_processes(root, mark)
        if not pids:
            self.cycle.append(role)  # not up yet: later
            return
        pid, action = self.rng.choice(pids), self.rng.choice(["SIGKILL", "SIGSTOP"])
        fault = {"wall_s": wall(self.run_dir), "role": role, "action": action, "pid": pid, "start": started_at(pid),
                 "at": time.time()}
        os.kill(pid, getattr(signal, action))
        self.faults.append(fault)
        print(f"chaos: {action} {role} (pid {pid}) at {fault['wall_s']:.0f} s", flush=True)
        if action == "SIGSTOP":
            timer = threading.Timer(STOP_S, self._continue, args=(fault,))
            timer.daemon = True
            timer.start()

    def _continue(self, fault: dict) -> None:
        if started_at(fault["pid"]) == fault["start"]:  # still there: distrl did not end it
            self.problems.append(f"{fault['role']} pid {fault['pid']} stopped for {STOP_S:g} s was not ended")
            os.kill(fault["pid"], signal.SIGCONT)

    def kill_driver(self, proc: subprocess.Popen, watch: CheckpointWatch) -> dict:
        """SIGKILL the driver right after a checkpoint that follows every fault's restart (the second one after:
        the first may have been under way when the last restart was counted), and what is left of its process
        tree; the newest checkpoint's counters and replay hash, for the resume to match."""
        deadline = time.time() + 120
        while not self.resolved() and time.time() < deadline:
            time.sleep(0.2)
        watch.scan()
        known = set(watch.seen)
        while len(set(watch.seen) - known) < 2 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
            watch.scan()
        tree = [(pid, started_at(pid)) for pid in descendants(proc.pid)]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(3.0)
        for pid, start in tree:  # an embedded Ray's agents may outlive the driver: ours to end
            if started_at(pid) == start:
                os.kill(pid, signal.SIGKILL)
        from distrl.checkpoint.run import load_latest

        path, state = load_latest(self.run_dir)
        print(f"chaos: SIGKILL driver at {state['meta']['wall_s']:.0f} s (after {os.path.basename(path)})", flush=True)
        counters = state["meta"]["counters"]
        return {"checkpoint": path, "wall_s": state["meta"]["wall_s"], "env_steps": counters["env_steps"],
                "updates": counters["updates"], "store_sha256": state["meta"].get("store_sha256")}

    def drive(self, proc: subprocess.Popen, killed: dict | None, watch: CheckpointWatch) -> tuple:
        """Inject faults into the running driver `proc` until it ends, or until the driver kill is due
        (then: (None, what the kill left)); (the process, None) once it ended."""
        budget, last = self.minutes * 60, 0.0
        while proc.poll() is None:
            time.sleep(0.5)
            now = wall(self.run_dir)
            if now <= 0 or budget - now < QUIET_END_S or not self.resolved():
                continue
            if killed is None and now >= self.driver_kill_at:
                return None, self.kill_driver(proc, watch)
            if killed is None and self.faults and now + QUIET_KILL_S > self.driver_kill_at:
                continue
            if now - last >= PERIOD_S * self.rng.uniform(0.75, 1.25):
                self.inject(proc.pid)
                last = now
        return proc, None


def start(args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "distrl.cli", *args], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def run_chaos(mode: str, minutes: float, seed: int = 0, run_dir: str | None = None, extra: tuple = ()) -> dict:
    """One chaos run; its checks under "checks", all true when "ok". `extra`: more config overrides."""
    run_dir = run_dir or os.path.join(tempfile.mkdtemp(prefix=f"chaos-{mode}-"), "run")
    chaos, watch, lines = Chaos(mode, minutes, seed, run_dir), CheckpointWatch(run_dir), FaultLines(run_dir)
    watch.start()
    lines.start()
    limit = time.time() + minutes * 60 + 300  # the run's own budget, start-ups, the resume: past it, a hang
    with open(run_dir + ".console.log", "w") as log:
        proc = start(["train", CONFIG, "--run-dir", run_dir, *overrides(mode, minutes, extra)], log)
        ended, killed = None, None
        try:
            while ended is None and time.time() < limit:
                ended, got = chaos.drive(proc, killed, watch)
                if got is not None:
                    killed = got
                    proc = start(["resume", run_dir, "--set", "log.progress=false"], log)
            if ended is None:
                chaos.problems.append("hang: the run did not end within its budget plus 300 s")
                proc.kill()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            exited = time.time()
            for thread in (watch, lines):
                thread.done.set()
                thread.join(timeout=10)
    watch.scan()
    lines.scan()
    fault_times(chaos.faults, lines.lines, {role: label for role, (_, _, label) in chaos.roles.items()})
    chaos.problems += [f"{f['role']} {f['action']} at {f['wall_s']:.0f} s: found after {f.get('found_s', 'no line')} s"
                       for f in chaos.faults if not f.get("found_s", 1e9) < 15.0]
    return check(chaos, watch, killed, proc.returncode, exited)


def check(chaos: Chaos, watch: CheckpointWatch, killed: dict | None, code: int, exited: float) -> dict:
    from distrl.checkpoint.run import load_latest
    from distrl.replay.store import digest

    run_dir = chaos.run_dir
    summary = json.load(open(os.path.join(run_dir, "summary.json"))) if os.path.exists(
        os.path.join(run_dir, "summary.json")) else {}
    injected = {role: sum(f["role"] == role for f in chaos.faults) for role in chaos.roles}
    counted = {role: summary.get(key) for role, (_, key, _) in chaos.roles.items()}
    resumes = [json.loads(line) for line in open(os.path.join(run_dir, "resumes.jsonl"))] \
        if os.path.exists(os.path.join(run_dir, "resumes.jsonl")) else []
    _, newest = load_latest(run_dir)
    rows = metrics(run_dir)
    # From the budget's end to the process's exit: to summary.json, then from summary.json to the exit.
    written = os.path.getmtime(os.path.join(run_dir, "summary.json")) if summary else exited
    ended_after_s = summary.get("stop_to_summary_s", 1e9) + exited - written
    checks = {
        "ended_by_its_stop_rule_exit_0": code == 0 and summary.get("stop_reason") == "max_seconds"
                                         and summary.get("failure") is None,
        "ended_within_10_s_of_its_budget": ended_after_s < ENDED_S,
        "every_fault_found_within_15_s": all(f.get("found_s", 1e9) < 15.0 for f in chaos.faults),
        "never_hung": not any(p.startswith("hang") for p in chaos.problems),
        "every_stopped_process_was_ended": not any("was not ended" in p for p in chaos.problems),
        "driver_killed_and_resumed_once": killed is not None and len(resumes) == 1,
        "nothing_went_back_across_the_resume": bool(resumes) and killed is not None and _not_back(resumes[0], killed, rows),
        "every_checkpoint_verifies": not watch.failed and len(watch.seen) > 0,
        "restarts_equal_faults_injected": injected == counted,
        "resumed_replay_hash_matches_its_checkpoint": bool(resumes) and killed is not None
                                                      and resumes[0]["store_sha256"] == killed["store_sha256"],
        "newest_checkpoint_replay_hash_matches": digest(newest["store"]) == newest["meta"].get("store_sha256"),
        "metrics_csv_monotonic": _monotonic(rows, watch),
    }
    return {"ok": all(checks.values()), "checks": checks, "mode": chaos.mode, "minutes": chaos.minutes,
            "faults": chaos.faults, "faults_injected": injected, "restarts_counted": counted, "driver_kill": killed,
            "problems": chaos.problems + watch.failed, "checkpoints_verified": len(watch.seen),
            "exit_code": code, "run_dir": run_dir, "ended_after_budget_s": round(ended_after_s, 2),
            "fault_times": summarize(chaos.faults),
            "summary": {k: summary.get(k) for k in ("stop_reason", "failure", "wall_s", "env_steps", "updates",
                                                     "updates_lost", "fragments_dropped", "workers_lost", "stop_to_summary_s",
                                                     "skipped_at_stop", "ended_at_stop")}}


def _not_back(resumed: dict, killed: dict, rows: list[dict]) -> bool:
    """The resume restored the newest checkpoint's counters, and every row after it is at or past them."""
    after = [r for r in rows if float(r["wall_s"]) > resumed["resumed_at_wall_s"]]
    return (resumed["env_steps"], resumed["updates"]) == (killed["env_steps"], killed["updates"]) and bool(after) \
        and all(int(r["env_steps"]) >= killed["env_steps"] and int(r["updates"]) >= killed["updates"] for r in after)


def _monotonic(rows: list[dict], watch: CheckpointWatch) -> bool:
    """wall_s, env_steps, episodes and the restart count never go back; updates only to a checkpoint's (a
    restarted learner resumes from the newest one)."""
    checkpoints = sorted(v for v in watch.seen.values() if v is not None)
    for a, b in zip(rows, rows[1:]):
        if float(b["wall_s"]) <= float(a["wall_s"]):
            return False
        if any(int(b[k]) < int(a[k]) for k in ("env_steps", "episodes", "worker_restarts")):
            return False
        if int(b["updates"]) < int(a["updates"]):
            floor = max([u for w, _, u in checkpoints if w <= float(b["wall_s"])], default=0)
            if int(b["updates"]) < floor:
                return False
    return bool(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--mode", choices=["single", "sync", "async"], required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="JSON results (default bench/results/chaos_MODE.json)")
    args = ap.parse_args()
    result = run_chaos(args.mode, args.minutes, args.seed)
    result["hardware"] = hardware()
    write_json(args.out or os.path.join(ROOT, "bench", "results", f"chaos_{args.mode}.json"), result)
    print("| mode | minutes | faults (kill/stop) | restarts counted = injected | found (s): kill, stop, median / max "
          "| resolved (s): kill, stop, median / max | ended after its budget (s) | driver kill + resume | "
          "checkpoints verified | all checks |\n|---|---|---|---|---|---|---|---|---|---|")
    kills = sum(f["action"] == "SIGKILL" for f in result["faults"])
    times = result["fault_times"]
    took = {k: ", ".join(f"{times[a][k + '_median']} / {times[a][k + '_max']}" if a in times else "-"
                         for a in ("SIGKILL", "SIGSTOP")) for k in ("found", "resolved")}
    print(f"| {args.mode} | {args.minutes:g} | {len(result['faults'])} ({kills}/{len(result['faults']) - kills}) | "
          f"{result['checks']['restarts_equal_faults_injected']} | {took['found']} | {took['resolved']} | "
          f"{result['ended_after_budget_s']} | {result['checks']['driver_killed_and_resumed_once']} "
          f"| {result['checkpoints_verified']} | {'pass' if result['ok'] else 'FAIL'} |")
    for name, ok in result["checks"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
