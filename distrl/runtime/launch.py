"""Starting a run or resuming one: build the roles for the mode, drive them, clean up."""
from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time

from distrl.checkpoint.lock import RunDirLock
from distrl.checkpoint.run import load_latest, restore_global_rng
from distrl.config import Config, ConfigError, apply_overrides, dump_yaml, from_dict, to_dict
from distrl.observe.repair import repair_logs
from distrl.observe.startup import StartupLine
from distrl.core import Roles
from distrl.roles.evaluation import saved_rank
from distrl.runtime.counters import Counters, counters_from_meta
from distrl.runtime.driver import Driver


def make_roles(cfg: Config, run_dir: str, start_time: float, address: str | None,
               eval_resume: dict | None = None) -> Roles:
    """The mode's roles, started; what the start is doing is said on the console meanwhile (it takes seconds:
    Ray and processes that each import torch)."""
    startup = StartupLine(start_time, cfg.log.progress)
    then = "" if cfg.mode == "single" else f"; joining Ray at {address}" if address else "; Ray starting"
    startup.say(f"starting {cfg.algo} on {cfg.env.id} ({cfg.mode} mode){then}")
    try:
        if cfg.mode == "single":
            from distrl.runtime.local import LocalRoles

            return LocalRoles(cfg, start_time, eval_resume, run_dir, startup)
        from distrl.runtime.ray_roles import RayRoles

        return RayRoles(cfg, run_dir, start_time, address, eval_resume, startup)
    finally:
        startup.close()  # training's progress line, or the error that ended the start, takes the line over


def run_training(cfg: Config, run_dir: str, start_time: float, address: str | None = None) -> dict:
    """Claim the run dir, start the roles, only then write config.yaml; drive them to a stop.

    A start-up failure (an unreachable cluster, an env that fails to build in a worker) leaves no
    run dir behind when this call created it, and a half-claimed one never.
    """
    run_dir = os.path.abspath(run_dir)
    created = make_run_dir(run_dir)
    lock = roles = None
    try:
        lock = RunDirLock(run_dir).acquire()
        if os.path.exists(os.path.join(run_dir, "config.yaml")):  # a run ended there since the caller looked
            raise ConfigError(f"run dir {run_dir} already holds a run; choose another --run-dir")
        roles = _start_roles(cfg, run_dir, start_time, address)
        _write_config(cfg, run_dir)
    except BaseException:
        try:
            if roles is not None:
                roles.close()
        finally:
            if lock is not None:  # only the lock's holder may remove it: a refused process never owns the dir
                remove_created(created, run_dir)
                lock.release()
        raise
    try:
        return _drive(Driver(cfg, roles, run_dir, start_time), roles)
    finally:
        lock.release()


def _start_roles(cfg: Config, run_dir: str, start_time: float, address: str | None) -> Roles:
    try:
        return make_roles(cfg, run_dir, start_time, address)
    except MemoryError:  # the replay's arrays are what a start-up allocates in bulk
        raise ConfigError(f"config key 'replay.capacity': this machine ran out of memory starting the run "
                          f"with {cfg.replay.capacity} items; use a smaller capacity") from None


def make_run_dir(run_dir: str) -> list[str]:
    """Create `run_dir` and its missing parents; the directories this call created, outermost first.

    Each is made with a plain mkdir, so of two processes racing for a new dir only one counts it as
    its own. ConfigError naming the path when one cannot be made."""
    missing, path = [], run_dir
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    created: list[str] = []
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            if os.path.isdir(path):
                continue  # another process made it just now: not ours to remove
            remove_created(created, run_dir)
            raise ConfigError(f"run dir {run_dir} cannot be created: {path} is a file, not a directory") from None
        except OSError as e:
            remove_created(created, run_dir)
            raise ConfigError(f"run dir {run_dir} cannot be created: {path}: {e.strerror or e}") from None
        created.append(path)
    return created


def remove_created(created: list[str], run_dir: str) -> None:
    """Undo `make_run_dir`: the run dir with what this process wrote into it (if this process made it),
    then the parents it made while they are empty (another run may have been started inside one)."""
    for path in reversed(created):
        if path == run_dir:
            shutil.rmtree(path, ignore_errors=True)
            continue
        try:
            os.rmdir(path)
        except OSError:
            return


def _write_config(cfg: Config, run_dir: str) -> None:
    try:
        with open(os.path.join(run_dir, "config.yaml"), "w") as fh:
            fh.write(dump_yaml(cfg))
    except OSError as e:
        raise ConfigError(f"run dir {run_dir}: cannot write config.yaml: {e.strerror or e}") from None


# What a resume may change: how long and how the run goes on, not what the checkpoint's state is.
RESUMABLE_SECTIONS = ("stop.", "log.", "eval.", "checkpoint.", "fault.", "async.", "placement.", "external.")
RESUMABLE_KEYS = {"workers", "mode", "device", "learner.batches_per_call", "learner.publish_interval",
                  "replay.samples_per_insert", "replay.error_buffer", "replay.beta_steps",
                  "learner.num_gradient_workers"}


def resume_config(ckpt_config: dict, overrides: list[str]) -> Config:
    """The checkpoint's config with `overrides`; ConfigError for an override the checkpoint cannot take."""
    before = flatten(ckpt_config)
    after = flatten(to_dict(from_dict(apply_overrides(json.loads(json.dumps(ckpt_config)), overrides))))
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key) and not (key in RESUMABLE_KEYS or key.startswith(RESUMABLE_SECTIONS)):
            raise ConfigError(f"config key '{key}' cannot change on resume: the checkpoint holds state built "
                              f"with {before.get(key)!r}, the override asks for {after.get(key)!r}")
    return from_dict(apply_overrides(json.loads(json.dumps(ckpt_config)), overrides))


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "kwargs":
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def resume_run(run_dir: str, overrides: list[str], address: str | None, validate) -> dict:
    """Continue a run from its newest verified checkpoint as if it had never stopped (wall time included)."""
    run_dir = os.path.abspath(run_dir)
    lock = RunDirLock(run_dir).acquire()  # a live run is refused before anything is read or written
    try:
        ckpt_path, state = load_latest(run_dir)
        cfg = resume_config(state["meta"]["config"], overrides)
        validate(cfg)
        counters: Counters = counters_from_meta(state["meta"]["counters"])
        start = time.time() - state["meta"]["wall_s"]
        roles = make_roles(cfg, run_dir, start, address,
                           {"evaluations": counters.evaluations, "best": saved_rank(run_dir)})
        try:
            roles.set_state(state)
        except Exception as e:  # noqa: BLE001 - whatever the roles raise, the user changed what they restore
            roles.close()
            raise ConfigError(f"the checkpoint {ckpt_path} cannot be restored with this config: "
                              f"{str(e).splitlines()[0][:200]}") from None
        restore_global_rng(state)
        cut = repair_logs(run_dir, state["meta"]["wall_s"])
        with open(os.path.join(run_dir, "resumes.jsonl"), "a") as fh:
            fh.write(json.dumps({"checkpoint": ckpt_path, "env_steps": counters.env_steps, "updates": counters.updates,
                                 "store_sha256": roles.store_digest(), "rows_cut": cut,
                                 "resumed_at_wall_s": state["meta"]["wall_s"]}) + "\n")
        return _drive(Driver(cfg, roles, run_dir, start, counters), roles)
    finally:
        lock.release()


def _drive(driver: Driver, roles: Roles) -> dict:
    def on_signal(signum, frame):
        if driver.stop_requested:  # the second one: stop now (Driver.run winds down without waiting)
            if driver.interruptible:
                raise KeyboardInterrupt
            return
        driver.request_stop("interrupted")  # the first: finish cleanly, checkpoint and summary written

    main_thread = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    try:
        return driver.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        roles.close()
