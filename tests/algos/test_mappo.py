"""MAPPO and IPPO: agents as rows of PPO's batch, each with its own episode ends, and only agents in their
episode in the losses; structured observations with action masks, and a recurrent actor with a state per
agent row (the runs that learn and act through Ray are in tests/runtime/test_mappo_runs.py)."""
import math
import os

import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl import tree
from distrl.algos.mappo import agent_rows, joint_space
from distrl.algos.ppo import ppo_loss
from distrl.cli import main
from distrl.config import load_config
from distrl.core import EnvSpec, Trajectory
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
    rows = agent_rows(obs, 2, "joint")  # leaves (E, N, obs): 2 axes up to the agents'
    assert rows["agent"].tolist() == [[0, 1, 2], [0, 1, 2]]
    np.testing.assert_array_equal(rows["own"][1, 2], obs[1, 2])
    np.testing.assert_array_equal(rows["joint"][1, 0], obs[1].reshape(-1))  # every agent's, in agent order
    np.testing.assert_array_equal(rows["joint"][1, 0], rows["joint"][1, 2])
    assert set(agent_rows(obs, 2)) == {"own", "agent"}
    state = np.arange(2 * 4, dtype=np.float32).reshape(2, 4)  # (E, state): one per env
    rows = agent_rows(obs, 2, "state", state)
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


# --- structured observations and action masks ---------------------------------------------------------
MASKED = "distrl.envs.testing:MaskedAgents"


def noisy_policy(algo, scale=0.5):
    """A learner and a policy acting with its weights plus noise (greedy actions that differ between rows)."""
    learner = algo.make_learner("cpu")
    rng = np.random.default_rng(7)
    weights = {k: v + scale * rng.standard_normal(v.shape).astype(v.dtype) for k, v in learner.get_weights().items()}
    learner.net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
    policy = algo.make_policy(0, 1, 0)
    policy.set_weights(weights, 0)
    return learner, policy


def test_a_structured_observation_makes_rows_whose_mask_is_their_own_leaf():
    rng = np.random.default_rng(0)
    obs = {"action_mask": rng.integers(0, 2, (2, 3, 4)).astype(np.int8), "kind": rng.integers(0, 5, (2, 3)),
           "pos": rng.normal(size=(2, 3, 2)).astype(np.float32)}  # (E, N, ...) leaves
    rows = agent_rows(obs, 2, "joint")
    assert set(rows) == {"own", "agent", "action_mask", "joint"} and set(rows["own"]) == {"kind", "pos"}
    np.testing.assert_array_equal(rows["action_mask"], obs["action_mask"])  # each agent's own
    np.testing.assert_array_equal(rows["joint"]["pos"][1, 2], obs["pos"][1].reshape(-1))  # every agent's, in order
    assert rows["joint"]["kind"][1, 0].tolist() == obs["kind"][1].tolist() == rows["joint"]["kind"][1, 2].tolist()
    space = joint_space(spaces.Dict({"kind": spaces.Discrete(5), "pos": spaces.Box(-5, 5, (2,), np.float32)}), 3)
    assert space["kind"] == spaces.MultiDiscrete([5, 5, 5]) and space["pos"].shape == (6,)
    assert space.contains({k: v[1, 0] for k, v in rows["joint"].items()})
    algo = make("central", f"env.id={MASKED}", "env.kwargs={num_agents: 3}")
    assert algo.acting_keys == ("own", "agent", "action_mask")
    acting = algo.row_space(algo.acting_keys)
    assert acting["own"] == spaces.Dict({"observation": spaces.Box(-1, 1, (3,), np.float32)})
    assert acting["action_mask"] == spaces.MultiBinary(6)
    assert algo.row_space(("joint",))["joint"]["observation"].shape == (9,)


def test_masked_actions_are_never_taken_and_have_zero_probability_in_the_learner():
    """Workers and the evaluator act masked, and the learner's log-probs and entropies are those of the masked
    distribution (agents of differing observation sizes, padded; the central critic reads their joint one)."""
    from distrl.algos.actor_critic import time_major
    from distrl.roles.evaluation import play_greedy

    kwargs = {"num_agents": 3, "sizes": [3, 5]}
    algo = make("central", f"env.id={MASKED}", f"env.kwargs={kwargs}")
    learner, policy = noisy_policy(algo)
    data = Rollout(policy, MultiAgentVectorEnv(MASKED, 4, 0, kwargs), 60, 0).sample().data
    assert (data["rewards"] == 1.0).all()  # a masked action would have paid -100 and ended the episode
    t = time_major(data, "cpu")
    obs, mask = tree.flatten_lead(t["obs"], 2), t["obs"]["action_mask"].reshape(-1, 6)
    assert obs["joint"]["observation"].shape == (60 * 12, 15)
    with torch.no_grad():
        dist, _ = learner.net(obs)
        logp, entropy, _ = learner.net.evaluate(obs, t["actions"].reshape(-1))
    p = dist.logp_all.exp()
    assert (p[mask == 0] == 0).all() and torch.allclose(p.sum(-1), torch.ones(len(p)))
    np.testing.assert_allclose(logp.numpy(), data["logp"].reshape(-1), atol=1e-5)  # the workers' own
    assert torch.isfinite(entropy).all() and math.log(3) - 0.5 < entropy.max() <= math.log(3) + 1e-5  # 3 of 6 legal
    assert math.isfinite(update_once(learner, data)["loss"])
    returns, _ = play_greedy(policy, MASKED, 6, 0, kwargs, multi_agent=True, action_mask="auto")
    assert returns.tolist() == [20.0] * 6  # greedy: every step legal


@pytest.mark.parametrize("sets, message", [
    (["env.kwargs={mask_in: info}", "env.action_mask=obs"],
     "config key 'env.action_mask': obs takes the observation's 'action_mask' key; the agents' observations are "),
    (["env.obs_keys=[observation, color]"], "config key 'env.obs_keys': an agent's observation has no key 'color'"),
])
def test_a_masked_env_the_run_cannot_take_is_one_line_exit_2(capsys, tmp_path, sets, message):
    import time

    import distrl.cli

    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "mappo_simple_spread.yaml")
    distrl.cli.START = time.time()
    run_dir = tmp_path / "run"
    args = sum((["--set", s] for s in [f"env.id={MASKED}", "env.kwargs={}", *sets]), [])
    code = main(["train", config, "--run-dir", str(run_dir), *args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and not run_dir.exists(), lines
    assert lines[0].startswith(f"distrl: error: {message}"), lines


def test_a_central_critic_of_image_leaves_reads_the_state_and_says_so_in_one_line():
    from distrl.registry import algorithm

    obs = spaces.Dict({"img": spaces.Box(0, 255, (3, 8, 8), np.uint8), "pos": spaces.Box(-1, 1, (2,), np.float32)})
    spec = EnvSpec(obs, spaces.Discrete(3), 2, state_space=spaces.Box(-1, 1, (4,), np.float32))

    def algo(*overrides):
        return make_algorithm(load_config(None, ["algo=mappo", "model.hidden=[16]", *overrides]), spec)

    problem = algo("mappo.critic=central").check_config()
    assert problem == ("config key 'mappo.central_input': joint concatenates the agents' vector leaves, and their "
                       "observation's leaf 'img' is an image: use mappo.central_input=state (the env's global state) "
                       "or mappo.critic=local")
    assert algorithm("dhc").check_spec(spec) is None  # DHC takes the same structured observation
    for ok in (algo("mappo.central_input=state"), algo("mappo.critic=local")):
        assert ok.check_config() is None
        net = ok.build_network()  # the image leaf through an image torso, for the actor
        assert net.pi_torso.keys == ("own", "agent") and any(isinstance(m, torch.nn.Conv2d) for m in net.modules())


# --- a recurrent actor ---------------------------------------------------------------------------------
def test_a_recurrent_actor_keeps_a_state_per_agent_row_that_the_learner_unrolls_alike():
    """Fragments that cut episodes (5 steps) and sequences (4 of 8 steps) cutting them too: each column's stored
    state is the worker's before the fragment, zero for every agent of an env whose episode starts, and the
    learner's unroll from it gives the log-probs the workers acted with."""
    from distrl.algos.actor_critic import estimates, time_major

    kwargs = {"num_agents": 3, "length": 5}
    algo = make("local", f"env.id={MASKED}", f"env.kwargs={kwargs}", "model.core=lstm", "model.core_size=8",
                "rollout.recurrence=4", "rollout.fragment_length=8")
    learner, policy = noisy_policy(algo)
    assert policy.initial_state(2).shape == (2, 3, 2, 8) and policy.state_shape == (2, 8)  # an env's; a row's
    assert learner.net.core is not None and learner.net.v_torso.keys == ("own", "agent")  # the critic: no state
    rollout = Rollout(policy, MultiAgentVectorEnv(MASKED, 2, 0, kwargs), 8, 0)
    first, second = rollout.sample().data, rollout.sample().data
    assert first["state"].shape == (1, 6, 2, 8) and not first["state"].any()  # every episode starts
    # Fragment 2 starts at step 8, inside the second episodes (steps 5-9): their states carried on.
    assert (np.abs(second["state"]).sum(axis=(0, 2, 3)) > 0).all()
    for data in (first, second):
        t = time_major(data, "cpu")
        est = estimates(learner.net, t, algo.recurrence)
        np.testing.assert_allclose(est.logp.numpy(), data["logp"], atol=1e-5)
        assert est.starts.shape == (2, 6, 2, 8)
    out = update_once(learner, second)
    assert math.isfinite(out["loss"]) and 0.0 < out["sequences_cut"] <= 1.0


def test_a_recurrent_masked_actor_exports_one_agents_step():
    """The exported actor of a MAPPO policy with a core and masks (what `distrl export` writes): inputs
    action_mask, agent, own's leaves and state; the file acts as the policy does, its state fed back."""
    import onnxruntime as ort

    from distrl.models.export import acting_network, example_batch, onnx_bytes

    algo = make("central", f"env.id={MASKED}", "env.kwargs={}", "model.core=gru")
    _, policy = noisy_policy(algo)
    session = ort.InferenceSession(onnx_bytes(acting_network(policy), example_batch(policy.acting_space)))
    assert [i.name for i in session.get_inputs()] == ["action_mask", "agent", "own.observation", "state"]
    assert [o.name for o in session.get_outputs()] == ["action", "out", "state_out"]
    envs = MultiAgentVectorEnv(MASKED, 2, 3, {})
    state, acted = np.zeros((4, 1, 64), np.float32), set()
    policy.episodes_ended(np.ones(2, bool))
    for _ in range(12):
        o = envs.obs["obs"]
        feed = {"action_mask": o["action_mask"].reshape(4, 6), "agent": np.tile(np.arange(2), 2),
                "own.observation": o["observation"].reshape(4, 3), "state": state}
        action, _, state = session.run(None, feed)
        actions, _ = policy.act(envs.obs, explore=False)
        np.testing.assert_array_equal(action, actions.reshape(-1))
        assert o["action_mask"].reshape(4, 6)[np.arange(4), action].all()
        acted |= set(action.tolist())
        envs.step(actions)
    assert len(acted) > 2
