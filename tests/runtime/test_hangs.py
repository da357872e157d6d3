"""Hangs at the shipped fault defaults, one run per mode. Every role's processes are SIGSTOPped (alive,
answering nothing) in waves while the run goes on: each is found hung within 15 s (fault.role_timeout_s
plus the heartbeat's one-second period), ended, restarted and counted once, and the run goes on. Then,
shortly before the run's budget ends, every role is SIGSTOPped again: the run ends within 10 s of its budget,
ends those processes rather than waiting for them, and says what it skipped. Nothing written is lost or
half-written: every checkpoint verifies, metrics.csv's rows are whole (and their blocked shares within
0-100%), and the restarted replay server was refilled from the newest checkpoint. The async run first stops a
rollout worker while it starts: its sign of life finds it hung as fast."""
import csv
import os
import signal
import threading
import time

from bench.procfs import started_at
from distrl import train
from distrl.checkpoint.layout import TMP_PREFIX
from distrl.checkpoint.read import read_checkpoint
from distrl.replay.store import digest
from tests.pace import scaled
from tests.runtime.processes import PACED, ended_at, fault_events, new_pids, resume_if_stopped, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
FOUND_S = 15.0  # a stopped process is ended this soon (fault.role_timeout_s is 5 s; the old default took 120 s)
ENDED_S = 10.0  # a run has ended this soon after its budget, whatever its roles do
APART_S = 2.0  # a later wave this long after the earlier ones' processes are ended: their fault lines apart
LEAD_S = 2.5  # the last wave: this long before the budget's end (less than fault.role_timeout_s: not yet hung)
RUN = ["log.progress=false", "log.tensorboard=false", "log.interval_s=0.5", "checkpoint.interval_s=3",
       "eval.target_return=null", *PACED]
# process name -> (the label its fault lines start with, summary.json's restarts key)
RAY_ROLES = {"RolloutWorker": ("worker ", "worker_restarts"), "Learner": ("learner", "learner_restarts"),
             "ReplayServer": ("replay server", "replay_restarts"),
             "ParameterServer": ("parameter server", "parameter_server_restarts"),
             "Evaluator": ("evaluator", "evaluator_restarts"),
             "InferenceServer": ("inference server", "inference_restarts"),
             "GradientWorker": ("gradient worker ", "gradient_worker_restarts")}
EVALUATOR = {"distrl-eval": ("evaluator", "evaluator_restarts")}


class Waves(threading.Thread):
    """SIGSTOPs this run's processes of each wave's roles in turn (`picks`: name -> how many of its processes,
    None for all), each once the one stopped in its start-up is back (`back()`) and the earlier waves'
    processes are ended. The first wave then waits for a few more metrics rows, an update and a checkpoint
    (with `fresh`, the moment a new one is written); a later one waits `APART_S`, while the earlier waves'
    processes restart. Then every role's, `LEAD_S` before the run's budget ends. With `start_up` (a name),
    first one of its processes while its constructor runs. Keeps (name, pid, when)."""

    def __init__(self, run_dir: str, names: list[str], waves: list[dict], budget_end: float, back, fresh: bool,
                 start_up: str | None = None):
        super().__init__(daemon=True)
        self.run_dir, self.names, self.waves, self.budget_end, self.back = run_dir, names, waves, budget_end, back
        self.fresh, self.start_up = fresh, start_up
        self.before = {name: snapshot(name) for name in names}  # an earlier run's may still be exiting
        self.starting: list = []  # [(name, pid, when, its start time)] of the one stopped in its start-up
        self.stopped: list[list] = []  # per wave: [(name, pid, when, its start time)]
        self.done = threading.Event()

    def rows(self) -> int:
        path = os.path.join(self.run_dir, "metrics.csv")
        return len(open(path).readlines()) if os.path.exists(path) else 0

    def learning(self) -> bool:
        """The learner has updated (a run's final evaluation, which the stop skips, needs an update)."""
        path = os.path.join(self.run_dir, "metrics.csv")
        rows = list(csv.DictReader(open(path))) if os.path.exists(path) else []
        return bool(rows) and int(rows[-1]["updates"] or 0) > 0

    def checkpoints(self) -> int:
        root = os.path.join(self.run_dir, "checkpoints")
        names = os.listdir(root) if os.path.isdir(root) else []
        return sum(os.path.exists(os.path.join(root, n, "DONE")) for n in names if n.startswith("ckpt-"))

    def wait(self, cond) -> bool:
        while not self.done.is_set() and time.time() < self.budget_end - LEAD_S and not cond():
            time.sleep(0.1)
        return cond()

    def run(self) -> None:
        if self.start_up:
            self.stop_starting(self.start_up)
        for wave in self.waves:
            if not self.wait(lambda: self.back([self.starting]) and self.ended(self.stopped)):
                return
            rows, apart = self.rows(), time.time() + APART_S
            if not self.wait(lambda: time.time() >= apart if self.stopped else
                             self.rows() >= rows + 4 and self.learning()):
                return
            ckpts = self.checkpoints() if self.fresh and not self.stopped else 0
            if not self.wait(lambda: self.checkpoints() > ckpts):
                return
            self.stopped.append(self.stop(wave))
        while not self.done.is_set() and time.time() < self.budget_end - LEAD_S:
            time.sleep(0.02)
        self.stopped.append(self.stop(dict.fromkeys(self.names)))

    @staticmethod
    def ended(waves: list[list]) -> bool:
        """Every process of `waves` has been ended (found hung: its restart may still be under way, and runs
        beside the next wave's, as a loaded machine's restarts would)."""
        return all(gone(pid, start) for wave in waves for _, pid, _, start in wave)

    def stop_starting(self, name: str) -> None:
        """One of this run's `name` processes whose sign of life is in Ray's key-value store (its constructor
        runs, its heartbeat not yet answered)."""
        from ray.experimental.internal_kv import _internal_kv_list

        while not self.done.is_set() and time.time() < self.budget_end - LEAD_S:
            starting = {int(v.split()[0]) for v in (_life(k) for k in _internal_kv_list(b"distrl-life:")) if v}
            pids = set(new_pids(name, self.before[name])) & starting
            if pids:
                pid = min(pids)
                os.kill(pid, signal.SIGSTOP)
                self.starting.append((name, pid, time.time(), started_at(pid)))
                return
            time.sleep(0.05)

    def stop(self, picks: dict) -> list:
        out = []
        for name, count in picks.items():  # the longest running first: not one a wave before this stopped
            for pid in sorted(new_pids(name, self.before[name]), key=lambda p: started_at(p) or 0)[:count]:
                out.append((name, pid, time.time(), started_at(pid)))
                os.kill(pid, signal.SIGSTOP)
        return out

    def resume(self) -> None:
        self.done.set()
        self.join(timeout=5)
        for wave in [self.starting, *self.stopped]:
            for _, pid, _, start in wave:
                resume_if_stopped(pid, start)


def back_once_counted(run_dir: str):
    """Whether every process the waves stopped so far has its `hung ..., restarted` line in faults.log."""
    def back(stopped: list) -> bool:
        lines = [text for _, text in fault_events(run_dir) if " hung " in text and ", restarted in " in text]
        return len(lines) >= sum(len(w) for w in stopped)
    return back


def run_with_waves(tmp_path, mode: str, names: list[str], waves: list[dict], budget_s: float, extra: list[str],
                   fresh: bool = False, start_up: str | None = None):
    """The run under `Waves` (`start_up`: see there), and what they stopped: per wave, the last one's last
    (`stopped`), and the process stopped in its start-up (`starting`, empty without `start_up`)."""
    run_dir = str(tmp_path / "run")
    start = time.time()
    roles = {n: (RAY_ROLES | EVALUATOR)[n] for n in names}
    waves_thread = Waves(run_dir, names, waves, start + budget_s, back_once_counted(run_dir), fresh, start_up)
    waves_thread.start()
    try:
        summary = train(CARTPOLE, run_dir=run_dir, start_time=start, overrides=[
            f"mode={mode}", f"stop.max_seconds={budget_s}", "seed=0", *RUN, *extra])
        ended = time.time()
    finally:
        waves_thread.resume()
    return run_dir, start, ended, summary, waves_thread.stopped, roles, waves_thread.starting


def check_waves(run_dir: str, start: float, stopped: list, roles: dict, summary: dict, starting: list = ()) -> None:
    """Each process stopped mid-run was found hung within FOUND_S, restarted, and counted once (as was the one
    stopped in its start-up, `starting`)."""
    assert len(stopped) >= 2, stopped  # every mid-run wave, then the last one
    events = fault_events(run_dir)
    hung = [e for e in events if " hung (no answer within 5 s), ended, restarted in " in e[1]
            or " hung (no sign of life for 5 s), ended, restarted in " in e[1]]
    assert len(hung) == sum(len(w) for w in stopped[:-1]), events  # one line each: counted once
    expected = {}
    for name, _, _, _ in starting:
        expected[roles[name][1]] = expected.get(roles[name][1], 0) + 1
    for wave, after in zip(stopped, stopped[1:]):
        stopped_at, next_at = (min(when for _, _, when, _ in w) - start for w in (wave, after))
        ours = [e for e in hung if stopped_at - 1 < ended_at(e) < next_at]
        assert sorted(e[1].split(" hung")[0].rstrip("0123456789 ") for e in ours) == \
            sorted(roles[name][0].strip() for name, _, _, _ in wave), (wave, events)
        late = [(round(ended_at(e) - stopped_at, 1), e[1]) for e in ours if ended_at(e) - stopped_at >= FOUND_S]
        assert not late, (stopped_at, late)
        for name, _, _, _ in wave:
            expected[roles[name][1]] = expected.get(roles[name][1], 0) + 1
    assert {key: summary[key] for key in expected} == expected, summary
    assert set(expected) == {key for _, key in roles.values()}  # every role of the mode was stopped


def check_start_up(run_dir: str, start: float, starting: list) -> None:
    """The process stopped in its start-up was found hung by its sign of life within FOUND_S (as fast as one
    stopped later, not at fault.start_timeout_s nor left silent until the stop), ended and restarted: one line."""
    assert starting, "no process was seen starting"
    (name, _, when, _), = starting
    lines = [e for e in fault_events(run_dir)
             if " hung in its start-up (no sign of life for 5 s), ended, restarted in " in e[1]]
    assert len(lines) == 1 and lines[0][1].startswith(RAY_ROLES[name][0]), fault_events(run_dir)
    assert ended_at(lines[0]) - (when - start) < FOUND_S, (when - start, lines)


def check_end(run_dir: str, start: float, ended: float, budget_s: float, summary: dict, last_wave: list,
              labels: set) -> None:
    """The run ended on its budget, within ENDED_S, with the last wave's processes ended and not waited for."""
    assert summary["stop_reason"] == "max_seconds" and summary["failure"] is None, summary
    assert ended - (start + budget_s) < ENDED_S, (ended - start, summary)
    assert summary["stop_to_summary_s"] < ENDED_S, summary
    assert set(summary["ended_at_stop"]) == labels, summary
    assert "final evaluation" in summary["skipped_at_stop"] or scored_at_stop(run_dir, start, last_wave), summary
    for name, pid, _, start_ticks in last_wave:  # ended, not left stopped (its exit may take a moment)
        assert gone_within(pid, start_ticks, 5.0), (name, pid)


def scored_at_stop(run_dir: str, start: float, last_wave: list) -> bool:
    """An evaluation the evaluator finished before the last wave stopped it reached the driver only at the
    stop (the driver was waiting on the stopped roles meanwhile, e.g. for a checkpoint): the run then has its
    last score, and the wind-down rightly does not ask the silent evaluator for another."""
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    wave_at = min(when for _, _, when, _ in last_wave) - start
    before = [r for r in rows if float(r["wall_s"]) < wave_at]
    score = ("eval_return_mean", "eval_return_std")
    return bool(before) and [rows[-1][k] for k in score] != [before[-1][k] for k in score]


def gone(pid: int, start_ticks: int) -> bool:
    """The process (pid, its start time) has exited (a zombie too: ended, not yet reaped)."""
    if started_at(pid) != start_ticks:
        return True
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def gone_within(pid: int, start_ticks: int, seconds: float) -> bool:
    deadline = time.time() + seconds
    while not gone(pid, start_ticks) and time.time() < deadline:
        time.sleep(0.1)
    return gone(pid, start_ticks)


def check_written(run_dir: str, summary: dict, last_taken: bool) -> None:
    """Every checkpoint verifies (none left half-written), the newest one's replay hashes as it recorded, and
    it is the run's end when `last_taken`; metrics.csv's rows are whole, in order, with blocked shares within
    0-100%."""
    root = os.path.join(run_dir, "checkpoints")
    names = sorted(os.listdir(root))
    assert not [n for n in names if n.startswith(TMP_PREFIX)], names
    done = [n for n in names if n.startswith("ckpt-")]
    assert done and all(os.path.exists(os.path.join(root, n, "DONE")) for n in done), names
    newest = read_checkpoint(os.path.join(root, done[-1]))  # verifies every file's sha256
    assert digest(newest["store"]) == newest["meta"]["store_sha256"]
    if last_taken:
        assert newest["meta"]["counters"]["env_steps"] == summary["env_steps"], newest["meta"]
    else:
        assert "checkpoint" in summary["skipped_at_stop"], summary
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    assert rows and all(None not in r.values() and "" != r["wall_s"] for r in rows), rows[-1]
    walls = [float(r["wall_s"]) for r in rows]
    steps = [int(r["env_steps"]) for r in rows]
    assert walls == sorted(walls) and steps == sorted(steps), (walls, steps)
    shares = [float(r[k]) for r in rows for k in ("workers_blocked_frac", "learner_blocked_frac")]
    assert all(0.0 <= s <= 1.0 for s in shares), shares


def went_on(run_dir: str, start: float, stopped: list) -> None:
    """env steps went on after the last mid-run wave's processes were back."""
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    at = max(when for _, _, when, _ in stopped[-2]) - start
    steps = [int(r["env_steps"]) for r in rows if float(r["wall_s"]) > at]
    assert steps and steps[-1] > steps[0], (at, rows[-5:])


def test_single_mode_hangs_at_the_defaults(tmp_path):
    """The evaluator's process: stopped once mid-run, then shortly before the budget ends (the learner and the
    rollout are the driver's own)."""
    budget = 24.0
    run_dir, start, ended, summary, stopped, roles, _ = run_with_waves(
        tmp_path, "single", ["distrl-eval"], [{"distrl-eval": 1}], budget, [])
    check_waves(run_dir, start, stopped, roles, summary)
    check_end(run_dir, start, ended, budget, summary, stopped[-1], {"evaluator"})
    check_written(run_dir, summary, last_taken=True)  # the learner is this process: its checkpoint is taken
    went_on(run_dir, start, stopped)


RAY_EXTRA = ["workers=2", "rollout.inference=central", "learner.num_gradient_workers=2"]
RAY_LABELS = {"evaluator", "gradient worker 0", "gradient worker 1", "inference server", "learner",
              "parameter server", "replay server", "worker 0", "worker 1"}


def test_sync_mode_hangs_at_the_defaults(ray_session, tmp_path, capfd):
    """Every role at once mid-run (the run waits for all of them: it goes on once they are back), then again
    shortly before the budget ends. The console has distrl's one line per hang and nothing of Ray's. One
    rollout worker: all eight processes restart at once, each importing torch, which takes 15-25 s of a
    loaded 2-core machine; the budget leaves the run time to go on after that."""
    budget, names = scaled(66.0), list(RAY_ROLES)  # restarts take longer on a slower machine: so does the run
    run_dir, start, ended, summary, stopped, roles, _ = run_with_waves(
        tmp_path, "sync", names, [dict.fromkeys(names)], budget, [*RAY_EXTRA, "workers=1"])
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Unhandled error" not in err, err
    hung = [line for line in err.splitlines() if " hung (" in line]
    assert len(hung) == len(stopped[0]) and all(line.startswith("distrl: ") for line in hung), err
    assert not os.path.exists(os.path.join(run_dir, "failure.log"))  # faults the runtime expects, not bugs
    check_waves(run_dir, start, stopped, roles, summary)
    check_end(run_dir, start, ended, budget, summary, stopped[-1], RAY_LABELS - {"worker 1"})
    assert summary["replay_refilled_items"] > 0, summary
    check_written(run_dir, summary, last_taken=False)
    went_on(run_dir, start, stopped)


def test_async_mode_hangs_at_the_defaults(ray_session, tmp_path):
    """A rollout worker stopped while its constructor runs (its sign of life begun, its heartbeat not yet
    answered): found hung as fast as one stopped later, ended, restarted and counted once. Once it is back,
    every role but one rollout worker and the inference server it acts through, right after a checkpoint: that
    worker delivers meanwhile (async mode waits on none of them; the next checkpoint waits for every role's
    state), then those two once the first wave's are ended (their restarts still under way: 15-25 s for the
    torch roles on a loaded 2-core machine), then every role shortly before the budget ends. Every worker acts
    through the inference server, so no env step is taken from the second wave until the server is back: the
    budget leaves time for every restart on a loaded machine, and for steps after them."""
    budget, names = scaled(85.0), list(RAY_ROLES)
    first = {**dict.fromkeys(names), "RolloutWorker": 1}
    del first["InferenceServer"]
    run_dir, start, ended, summary, stopped, roles, starting = run_with_waves(
        tmp_path, "async", names, [first, {"RolloutWorker": 1, "InferenceServer": 1}], budget,
        [*RAY_EXTRA, "replay.error_buffer=1e9"],  # the limiter lets it run while the learner hangs
        fresh=True, start_up="RolloutWorker")
    check_start_up(run_dir, start, starting)
    check_waves(run_dir, start, stopped, roles, summary, starting)
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    hung_at = min(when for _, _, when, _ in stopped[0]) - start
    during = [int(r["env_steps"]) for r in rows if hung_at + 0.5 < float(r["wall_s"]) < hung_at + 3]
    assert during and during[-1] > during[0], rows  # the other worker delivered while the rest hung
    check_end(run_dir, start, ended, budget, summary, stopped[-1], RAY_LABELS)
    assert summary["replay_refilled_items"] > 0, summary
    check_written(run_dir, summary, last_taken=False)
    went_on(run_dir, start, stopped)


def _life(key: bytes):
    from ray.experimental.internal_kv import _internal_kv_get

    return (_internal_kv_get(key) or b"").decode()
