"""The Ray roles' process set-up."""
import os

import pytest
import ray

from distrl.config import load_config
from distrl.runtime.cluster import RayRoles, heap_runtime_env


def _maps_jemalloc(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "libjemalloc" in f.read()


@pytest.mark.skipif(not heap_runtime_env(), reason="no jemalloc bundled with this Ray (or LD_PRELOAD set)")
def test_learner_and_replay_server_run_on_jemalloc_and_workers_do_not(ray_session, tmp_path):
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "apex_dqn_cartpole.yaml"),
                      ["mode=async", "workers=1", "log.tensorboard=false"])
    roles = RayRoles(cfg, str(tmp_path), 0.0)
    try:
        assert _maps_jemalloc(ray.get(roles.learner.pid.remote()))
        assert _maps_jemalloc(roles.replay_pid)
        assert not _maps_jemalloc(roles.worker_pids()[0])
    finally:
        roles.close()
