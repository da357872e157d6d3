"""The Ray roles' process set-up: the driver's CPU priority, one compute thread where a network runs, jemalloc
where arrays churn."""
import os
import sys

import pytest
import ray

from distrl.config import load_config
from distrl.runtime.ray_roles import RayRoles
from distrl.runtime.ray_setup import heap_runtime_env

CARTPOLE = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "apex_dqn_cartpole.yaml")


@pytest.fixture(scope="module")
def checkpointed(ray_session, tmp_path_factory):
    """Ape-X roles in async mode that have sampled a fragment and taken a whole-run checkpoint's state
    (every role's state, the replay written by its server): (roles, state)."""
    run_dir = str(tmp_path_factory.mktemp("roles"))
    cfg = load_config(CARTPOLE, ["mode=async", "workers=1", "log.tensorboard=false"])
    roles = RayRoles(cfg, run_dir, 0.0)
    try:
        for _ in range(500):
            if roles.gather(True).infos:
                break
        state = roles.get_state()
        state["store"](run_dir)
        yield roles, state
    finally:
        roles.close()


def _torch_threads(actor) -> int | None:
    """torch's intra-op threads in the actor's process (the check runs there); None without torch."""
    return ray.get(actor.__ray_call__.remote(
        lambda self: sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None))


def test_every_process_that_runs_a_network_runs_it_on_one_thread_even_after_a_checkpoint(checkpointed):
    """On a few cores, intra-op threads would only contend with the other roles' processes."""
    roles, state = checkpointed
    assert state["workers"][0] is not None and state["workers"][0]["env_steps"] > 0  # the worker's get_state ran
    for name, actor in (("learner", roles.learner), ("worker", roles.workers[0]), ("evaluator", roles.evaluator)):
        assert _torch_threads(actor) == 1, name


def test_every_role_runs_at_the_drivers_cpu_priority(checkpointed):
    """Ray's default (nice 15) would let any busy process on the machine starve the roles."""
    roles, _ = checkpointed
    pids = [ray.get(actor.pid.remote()) for actor in roles.actors()]
    assert len(pids) >= 4 and {os.getpriority(os.PRIO_PROCESS, pid) for pid in pids} == \
        {os.getpriority(os.PRIO_PROCESS, 0)}, pids


def _maps(pid: int, lib: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return lib in f.read()


@pytest.mark.skipif(not heap_runtime_env(), reason="no jemalloc bundled with this Ray (or LD_PRELOAD set)")
def test_learner_and_replay_server_run_on_jemalloc(checkpointed):
    roles, _ = checkpointed
    assert _maps(ray.get(roles.learner.pid.remote()), "libjemalloc")
    assert _maps(roles.watch.pids["replay"], "libjemalloc")
    assert not _maps(ray.get(roles.workers[0].pid.remote()), "libjemalloc")


def test_a_config_too_large_to_travel_with_a_roles_restart_is_refused():
    """Ray keeps a constructor argument over 100 KiB in its object store, where a restart can lose it: every
    role's arguments are checked to travel inline instead."""
    from distrl.config import ConfigError, to_dict
    from distrl.runtime.ray_start import MAX_ARGUMENT_BYTES, restartable

    d = to_dict(load_config(CARTPOLE))
    assert restartable(d, "distrl-run-parameter-server", 0) == (d, "distrl-run-parameter-server", 0)
    with pytest.raises(ConfigError, match=r"env\.kwargs"):
        restartable({**d, "env": {**d["env"], "kwargs": {"blob": "x" * MAX_ARGUMENT_BYTES}}})
