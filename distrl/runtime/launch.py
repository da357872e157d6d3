"""Starting a run or resuming one: build the roles for the mode, drive them, clean up."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

from distrl.checkpoint.run import restore_global_rng
from distrl.config import Config, dump_yaml
from distrl.core import Roles
from distrl.runtime.counters import Counters, counters_from_meta
from distrl.runtime.driver import Driver


def make_roles(cfg: Config, run_dir: str, start_time: float, address: str | None,
               eval_resume: dict | None = None) -> Roles:
    if cfg.mode == "single":
        from distrl.runtime.local import LocalRoles

        return LocalRoles(cfg, run_dir, start_time, eval_resume)
    from distrl.runtime.ray_roles import RayRoles

    return RayRoles(cfg, run_dir, start_time, address, eval_resume)


def run_training(cfg: Config, run_dir: str, start_time: float, address: str | None = None) -> dict:
    """Write config.yaml, start the roles, drive them to a stop, write summary.json."""
    os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w") as fh:
        fh.write(dump_yaml(cfg))
    roles = make_roles(cfg, run_dir, start_time, address)
    return _drive(Driver(cfg, roles, run_dir, start_time), roles)


def resume_training(cfg: Config, run_dir: str, ckpt_path: str, state: dict, address: str | None = None) -> dict:
    """Continue a run from a checkpoint as if it had never stopped (wall time included)."""
    counters: Counters = counters_from_meta(state["meta"]["counters"])
    start = time.time() - state["meta"]["wall_s"]
    eval_resume = {"evaluations": counters.evaluations, "best": counters.best_eval}
    roles = make_roles(cfg, run_dir, start, address, eval_resume)
    roles.set_state(state)
    restore_global_rng(state)
    with open(os.path.join(run_dir, "resumes.jsonl"), "a") as fh:
        fh.write(json.dumps({"checkpoint": ckpt_path, "env_steps": counters.env_steps, "updates": counters.updates,
                             "store_sha256": roles.store_digest(),
                             "resumed_at_wall_s": state["meta"]["wall_s"]}) + "\n")
    return _drive(Driver(cfg, roles, run_dir, start, counters), roles)


def _drive(driver: Driver, roles: Roles) -> dict:
    def on_signal(signum, frame):  # finish cleanly: checkpoint, summary and files still written
        driver.stop_requested = "interrupted"

    main_thread = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    try:
        return driver.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        roles.close()
