"""The Ray roles' process set-up."""
import os

import pytest
import ray

from distrl.config import load_config
from distrl.runtime.ray_roles import RayRoles
from distrl.runtime.ray_setup import heap_runtime_env


def _maps(pid: int, lib: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return lib in f.read()


def _maps_jemalloc(pid: int) -> bool:
    return _maps(pid, "libjemalloc")


@pytest.mark.skipif(not heap_runtime_env(), reason="no jemalloc bundled with this Ray (or LD_PRELOAD set)")
def test_learner_and_replay_server_run_on_jemalloc_and_only_the_learner_loads_torch_even_at_a_checkpoint(ray_session, tmp_path):
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "apex_dqn_cartpole.yaml"),
                      ["mode=async", "workers=1", "log.tensorboard=false"])
    roles = RayRoles(cfg, str(tmp_path), 0.0)
    try:
        assert _maps_jemalloc(ray.get(roles.learner.pid.remote()))
        assert _maps_jemalloc(roles.watch.pids["replay"])
        assert not _maps_jemalloc(roles.worker_pids()[0])
        # Only the learner loads torch: workers and the evaluator act in numpy, and taking a
        # checkpoint (every role's state, the replay written by its server) loads it nowhere else.
        for _ in range(500):
            if roles.gather(True).infos:
                break
        state = roles.get_state()
        state["store"](str(tmp_path))
        assert state["workers"][0]["env_steps"] > 0
        assert _maps(ray.get(roles.learner.pid.remote()), "libtorch_cpu")
        for pid in (roles.worker_pids()[0], ray.get(roles.evaluator.pid.remote()), roles.watch.pids["replay"]):
            assert not _maps(pid, "libtorch_cpu"), pid
    finally:
        roles.close()
