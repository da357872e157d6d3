"""The vector of multi-agent envs a worker steps: auto-reset with the true final observation, metrics, faults."""
import os

import numpy as np

from distrl.config import load_config
from distrl.envs.mapf import MAPF
from distrl.envs.multiagent_vector import MultiAgentVectorEnv

MAPF_ID = "distrl.envs.mapf:MAPF"
SMALL = {"size": 6, "num_agents": 3, "density": 0.1, "fov": 5, "max_steps": 5}


def test_shapes_seeding_and_true_final_observations():
    a, b = (MultiAgentVectorEnv(MAPF_ID, 4, seed=3, kwargs=SMALL) for _ in range(2))
    for k in ("obs", "comm_mask", "active"):
        np.testing.assert_array_equal(a.obs[k], b.obs[k])
    assert a.obs["obs"].shape == (4, 3, 7, 5, 5) and a.obs["comm_mask"].shape == (4, 3, 3)
    rng = np.random.default_rng(0)
    for t in range(5):  # max_steps 5: every env truncates at the fifth step
        before = {k: v.copy() for k, v in a.obs.items()}
        nxt, rewards, term, trunc, finished = a.step(rng.integers(0, 5, (4, 3)))
        assert rewards.shape == (4, 3) and nxt["obs"].shape == before["obs"].shape
    assert (term | trunc).all() and len(finished) == 4
    # The step returned the final observations; the env rows now hold fresh episodes.
    assert not np.array_equal(nxt["obs"], a.obs["obs"])
    assert all(info["length"] == 5 and "success" in info for info in a.episode_info)
    assert a.episode_length.tolist() == [0, 0, 0, 0]


def test_the_final_observation_is_what_the_env_saw_before_its_reset():
    vec = MultiAgentVectorEnv(MAPF_ID, 1, seed=5, kwargs=SMALL)
    ref = MAPF(**SMALL)
    ref.reset(seed=5)
    actions = np.random.default_rng(1).integers(0, 5, (5, 3))
    for t in range(5):
        step = ref.step(actions[t])
        nxt, *_ = vec.step(actions[t][None])
    np.testing.assert_array_equal(nxt["obs"][0], step.obs)
    np.testing.assert_array_equal(nxt["comm_mask"][0], step.comm_mask)


def test_a_failing_env_ends_its_episode_and_is_counted(monkeypatch):
    vec = MultiAgentVectorEnv(MAPF_ID, 2, seed=0, kwargs=SMALL)
    monkeypatch.setattr(vec.envs[1], "step", lambda actions: (_ for _ in ()).throw(RuntimeError("boom")))
    _, rewards, term, trunc, _ = vec.step(np.zeros((2, 3), np.int64))
    assert vec.env_errors == 1 and vec.errored.tolist() == [False, True]
    assert trunc[1] and not term[1] and (rewards[1] == 0).all()


def test_a_pettingzoo_envs_comm_k_comes_from_the_config():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "dhc_simple_spread.yaml")
    cfg = load_config(path, ["env.kwargs={N: 3, continuous_actions: false, max_cycles: 25, comm_k: 1}"])
    vec = MultiAgentVectorEnv(cfg.env.id, 2, cfg.seed, cfg.env.kwargs)
    for _ in range(3):
        assert (vec.obs["comm_mask"].sum(axis=-1) == 1).all()  # one neighbour each, not all pairs
        vec.step(np.zeros((2, 3), np.int64))
    default = MultiAgentVectorEnv(cfg.env.id, 1, cfg.seed, {**cfg.env.kwargs, "comm_k": None})
    assert (default.obs["comm_mask"].sum(axis=-1) == 2).all()


def test_a_global_state_is_stacked_with_the_observations_kept_by_a_failing_env_and_left_out_unless_asked(monkeypatch):
    kwargs = {"N": 3, "continuous_actions": False, "max_cycles": 25}
    vec = MultiAgentVectorEnv("mpe2:simple_spread_v3", 2, 0, kwargs)
    assert vec.obs["global_state"].shape == (2, 54) and vec.obs["global_state"].dtype == np.float32
    before = vec.obs["global_state"].copy()
    monkeypatch.setattr(vec.envs[1], "step", lambda actions: (_ for _ in ()).throw(RuntimeError("boom")))
    nxt, *_ = vec.step(np.zeros((2, 3), np.int64))
    assert set(vec.fields(nxt, "next_")) == {"next_obs", "next_comm_mask", "next_active", "next_global_state"}
    np.testing.assert_array_equal(nxt["global_state"][1], before[1])  # the failed env's last state
    assert "global_state" not in MultiAgentVectorEnv(MAPF_ID, 1, 0, SMALL).obs
    without = MultiAgentVectorEnv("mpe2:simple_spread_v3", 2, 0, kwargs, with_state=False)
    assert "global_state" not in without.obs and "global_state" not in without.step(np.zeros((2, 3), np.int64))[0]
