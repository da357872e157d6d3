"""A restarted InferenceServer keeps every env's recurrent state: a worker gives its envs' states back to the
new process, so a recurrent policy's outputs across the restart are those of a server that never died."""
import os
import signal

import numpy as np
import ray

from distrl.acting import LocalInference
from distrl.config import load_config, to_dict
from distrl.roles.factory import acting_policy, make_algorithm
from distrl.runtime.actors import ParameterServer
from distrl.runtime.inference import InferenceServer, RemoteInference

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_restarted_inference_server_gets_each_envs_recurrent_state_back(ray_session):
    cfg = load_config(os.path.join(ROOT, "configs", "r2d2_position_only_cartpole.yaml"),
                      ["mode=sync", "workers=1", "seed=5", "rollout.batch_timeout_ms=1"])
    algo = make_algorithm(cfg)
    weights = algo.make_learner("cpu").get_weights()
    local_policy = acting_policy(cfg, 0, 1)
    local_policy.set_weights(weights, 0)
    local = LocalInference(local_policy)
    ps = ParameterServer.remote()
    server = InferenceServer.options(max_restarts=1, max_task_retries=-1).remote(to_dict(cfg), ps, 1)
    try:
        ray.get(ps.push.remote(0, weights))
        remote = RemoteInference(server, 0, acting_policy(cfg, 0, 1))
        rng = np.random.default_rng(0)
        shape = (cfg.env.num_envs, *algo.spec.observation_space.shape)
        states_before_restart, first = None, ray.get(server.pid.remote(), timeout=120)
        for step in range(12):
            if step == 6:  # mid-episode: every env's state is far from zero by now
                os.kill(first, signal.SIGKILL)
            if step == 8:  # some envs start a new episode across the restart
                done = np.zeros(cfg.env.num_envs, bool)
                done[0] = True
                local.reset(done)
                remote.reset(done)
            obs = rng.standard_normal(shape).astype(np.float32)
            expected, got = local.step(obs), remote.step(obs)
            assert expected.keys() == got.keys()
            for k in expected:
                np.testing.assert_allclose(got[k], expected[k], rtol=1e-5, atol=1e-5, err_msg=f"{k} at step {step}")
            if step == 5:
                states_before_restart = got["state"]
        assert np.abs(states_before_restart).max() > 1e-3  # there was a state to lose
        assert remote.server_pid == ray.get(server.pid.remote()) != first  # answered by the restarted process
    finally:
        ray.kill(server)
        ray.kill(ps)
