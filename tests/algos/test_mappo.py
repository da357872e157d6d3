"""MAPPO and IPPO: agents as rows of PPO's batch, each with its own episode ends, and only agents in their
episode in the losses."""
import math
import os

import numpy as np
import pytest
import torch

from distrl.algos.mappo import agent_rows
from distrl.algos.ppo import ppo_loss
from distrl.cli import main
from distrl.config import load_config
from distrl.core import Trajectory
from distrl.envs.multiagent_vector import MultiAgentVectorEnv
from distrl.roles.factory import make_algorithm, make_rollout
from distrl.roles.learning import update_once
from distrl.roles.rollout import Rollout

SPREAD = "mpe2:simple_spread_v3"
KWARGS = {"N": 3, "continuous_actions": False, "max_cycles": 10}


def make(critic="central", *overrides):
    cfg = load_config(None, ["algo=mappo", f"env.id={SPREAD}", f"env.kwargs={KWARGS}", f"mappo.critic={critic}",
                             "model.hidden=[16]", *overrides])
    return make_algorithm(cfg)


def test_an_agents_row_holds_its_observation_its_index_and_for_the_central_critic_everyones():
    obs = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)  # (E, N, obs)
    rows = agent_rows(obs, 1, "joint")
    assert rows["agent"].tolist() == [[0, 1, 2], [0, 1, 2]]
    np.testing.assert_array_equal(rows["own"][1, 2], obs[1, 2])
    np.testing.assert_array_equal(rows["joint"][1, 0], obs[1].reshape(-1))  # every agent's, in agent order
    np.testing.assert_array_equal(rows["joint"][1, 0], rows["joint"][1, 2])
    assert set(agent_rows(obs, 1)) == {"own", "agent"}
    state = np.arange(2 * 4, dtype=np.float32).reshape(2, 4)  # (E, state): one per env
    rows = agent_rows(obs, 1, "state", state)
    assert set(rows) == {"own", "agent", "state"} and rows["state"].shape == (2, 3, 4)
    np.testing.assert_array_equal(rows["state"][1], np.stack([state[1]] * 3))  # every agent of env 1: its state


def test_an_agent_that_leaves_early_ends_its_own_column_and_its_later_rows_are_not_live():
    algo = make()
    policy = algo.make_policy(0, 1, 0)
    T, E, N = 3, 1, 3
    obs = np.random.default_rng(0).normal(size=(T, E, N, 18)).astype(np.float32)
    active = np.ones((T, E, N), bool)
    active[2, 0, 1] = False                       # agent 1 left after step 1
    next_active = np.concatenate([active[1:], np.ones((1, E, N), bool)])
    next_active[2, 0, 1] = False
    truncated = np.array([[False], [False], [True]])  # the episode is cut after step 2
    traj = Trajectory(obs, np.zeros((T, E, N), np.int64), np.ones((T, E, N), np.float32), np.zeros((T, E), bool),
                      truncated, obs, {"logp": np.zeros((T, E, N), np.float32), "active": active,
                                       "next_active": next_active})
    items, _ = policy.postprocess(traj)
    assert items["obs"]["own"].shape == (T, E * N, 18) and items["obs"]["joint"].shape == (T, E * N, 54)
    assert items["terminated"][:, 1].tolist() == [False, True, True]  # its episode ended at step 1
    assert items["truncated"][:, 1].tolist() == [False, False, False]
    assert items["truncated"][:, 0].tolist() == [False, False, True]  # the others bootstrap at the cut
    assert items["live"][:, 1].tolist() == [1.0, 1.0, 0.0]


def test_rows_that_are_not_live_change_no_loss():
    c = make().cfg
    rng = np.random.default_rng(1)
    x = [torch.as_tensor(rng.normal(size=6), dtype=torch.float32) for _ in range(7)]
    live = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    loss, _ = ppo_loss(*x, c, live=live)
    y = [v.clone() for v in x]
    for v in y:
        v[4:] += 100.0  # whatever the rows of departed agents hold
    assert ppo_loss(*y, c, live=live)[0].item() == pytest.approx(loss.item(), rel=1e-6)
    assert ppo_loss(*[v[:4] for v in x], c)[0].item() == pytest.approx(loss.item(), rel=1e-6)


@pytest.mark.parametrize("critic, continuous", [("central", False), ("local", False), ("central", True)])
def test_one_update_on_a_real_rollout_of_simple_spread(critic, continuous):
    kwargs = {**KWARGS, "continuous_actions": continuous}
    algo = make(critic, f"env.kwargs={kwargs}")
    learner = algo.make_learner("cpu")
    policy = algo.make_policy(0, 1, 0)
    policy.set_weights(learner.get_weights(), 0)
    envs = MultiAgentVectorEnv(SPREAD, 2, 0, kwargs)
    data = Rollout(policy, envs, 12, 0).sample().data
    assert data["rewards"].shape == (12, 6) and data["actions"].shape == ((12, 6, 5) if continuous else (12, 6))
    critic_keys = {"joint", "agent"} if critic == "central" else {"own", "agent"}
    assert set(learner.net.v_torso.keys) == critic_keys and set(learner.net.pi_torso.keys) == {"own", "agent"}
    before = {k: v.copy() for k, v in learner.get_weights().items()}
    out = update_once(learner, data)
    assert learner.updates == 1 and math.isfinite(out["loss"])
    assert any(not np.array_equal(before[k], v) for k, v in learner.get_weights().items())
    actions, _ = policy.act(envs.obs, explore=False)
    assert actions.shape == ((2, 3, 5) if continuous else (2, 3))
    if continuous:  # the Box's bounds, [0, 1] for MPE
        assert actions.min() >= 0.0 and actions.max() <= 1.0


def test_the_central_critic_reads_the_global_state_with_central_input_state():
    algo = make("central", "mappo.central_input=state")
    assert algo.check_config() is None
    learner = algo.make_learner("cpu")
    assert set(learner.net.v_torso.keys) == {"state", "agent"} and set(learner.net.pi_torso.keys) == {"own", "agent"}
    assert algo.torso_spaces()[1]["state"].shape == (54,)  # simple_spread's state(), for 3 agents
    policy = algo.make_policy(0, 1, 0)
    policy.set_weights(learner.get_weights(), 0)
    cfg = load_config(None, ["algo=mappo", f"env.id={SPREAD}", f"env.kwargs={KWARGS}", "env.num_envs=2"])
    assert make_rollout(cfg, policy, 0, 0).envs.with_state  # a worker's envs send the state to this policy only
    assert not make_rollout(cfg, make("central").make_policy(0, 1, 0), 0, 0).envs.with_state
    data = Rollout(policy, MultiAgentVectorEnv(SPREAD, 2, 0, KWARGS), 12, 0).sample().data
    assert set(data["obs"]) == {"own", "agent", "state"} and data["obs"]["state"].shape == (12, 6, 54)
    assert data["next_obs"]["state"].shape == (12, 6, 54)
    # simple_spread's state is every agent's observation: each of an env's agents' rows holds it.
    np.testing.assert_array_equal(data["obs"]["state"][:, 0], data["obs"]["own"][:, :3].reshape(12, 54))
    np.testing.assert_array_equal(data["obs"]["state"][:, 0], data["obs"]["state"][:, 2])
    assert math.isfinite(update_once(learner, data)["loss"]) and learner.updates == 1


def test_central_input_state_on_an_env_without_a_state_is_one_line_exit_2(capsys, tmp_path):
    import time

    import distrl.cli

    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "mappo_simple_spread.yaml")
    distrl.cli.START = time.time()
    run_dir = tmp_path / "run"
    code = main(["train", config, "--run-dir", str(run_dir), "--set", "env.id=distrl.envs.mapf:MAPF",
                 "--set", "env.kwargs={size: 6, num_agents: 3}", "--set", "mappo.central_input=state"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and not run_dir.exists(), lines
    assert lines[0].startswith("distrl: error: config key 'mappo.central_input': state needs an env with a global "
                               "state") and lines[0].endswith("(distrl.envs.mapf:MAPF)")
    mapf = ["env.id=distrl.envs.mapf:MAPF", "env.kwargs={size: 6, num_agents: 3}", "mappo.central_input=state"]
    assert make("local", *mapf).check_config() is None  # IPPO's critic reads no state
