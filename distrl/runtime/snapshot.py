"""A whole-run checkpoint from the driver's side: the roles' state, the counters, the RNGs."""
from __future__ import annotations

import time

from distrl.checkpoint.run import capture_global_rng, write_checkpoint
from distrl.config import dump_yaml, to_dict

CONFIG = "config.yaml"  # the run's config, covered by the checkpoint's DONE: what a resume starts from
from distrl.runtime.counters import counters_to_meta


def save_checkpoint(driver) -> float | None:
    """Checkpoint everything the run needs to continue: the seconds it took, or None when the learner's
    weights are not finite (nothing is written, so the newest checkpoint stays the last good one)."""
    t0 = time.time()
    roles_state = driver.roles.get_state()
    if roles_state["learner"] is None:
        return None
    rng = capture_global_rng()
    meta = {"counters": counters_to_meta(driver.c), "wall_s": time.time() - driver.start,
            "config": to_dict(driver.cfg), "python_rng": rng["python_rng"]}
    write_checkpoint(driver.run_dir, {
        "meta": meta, "learner": roles_state["learner"], "store": roles_state["store"],
        "workers": roles_state["workers"], "torch_rng": rng["torch_rng"], "numpy_rng": rng["numpy_rng"]},
        keep=driver.cfg.checkpoint.keep, files={CONFIG: dump_yaml(driver.cfg).encode()})
    return time.time() - t0
