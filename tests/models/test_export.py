"""The acting network out of distrl (`distrl.models.export`, `distrl export`): onnxruntime and TorchScript
give the actions and outputs of distrl's own policy on the same observations, uint8 frames included, and a
recurrent policy's actions and states step by step over whole episodes."""
import io
import os
import threading

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn
from gymnasium import spaces

from distrl.cli import main
from distrl.config import dump_yaml, load_config
from distrl.core import EnvSpec
from distrl.envs import VectorEnv, env_spec
from distrl.models.export import ExportError, acting_network, example_batch, onnx_bytes, torchscript_bytes
from distrl.models.numpy_run import numpy_program
from distrl.roles.evaluation import save_best
from distrl.roles.factory import make_algorithm

FRAMES = spaces.Box(0, 255, (10, 10, 4), np.uint8)       # MinAtar-shaped: the minatar torso
ATARI = spaces.Box(0, 255, (4, 84, 84), np.uint8)        # Atari-shaped: the Nature CNN
VECTOR = spaces.Box(-np.inf, np.inf, (5,), np.float32)
BOX = spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))

CASES = [("apex_dqn", VECTOR, spaces.Discrete(3)), ("apex_dqn", FRAMES, spaces.Discrete(4)),
         ("apex_dqn", ATARI, spaces.Discrete(4)), ("ppo", VECTOR, spaces.Discrete(3)), ("ppo", VECTOR, BOX),
         ("ppo", FRAMES, spaces.Discrete(4)), ("impala", VECTOR, BOX), ("sac", VECTOR, BOX)]


def trained_policy(algo, obs_space, act_space, *overrides):
    """A greedy policy with weights a learner made (some updates' worth of noise in them)."""
    cfg = load_config(None, [f"algo={algo}", *overrides])
    algorithm = make_algorithm(cfg, EnvSpec(obs_space, act_space))
    learner = algorithm.make_learner("cpu")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in (learner.net if hasattr(learner, "net") else learner.q if hasattr(learner, "q") else learner.actor).parameters():
            p.add_(0.1 * torch.randn_like(p))
    policy = algorithm.make_policy(-1, 1, 0)
    policy.set_weights(learner.get_weights(), 5)
    return policy


def observations(space, n=32):
    rng = np.random.default_rng(0)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (n, *space.shape)).astype(np.uint8)
    return rng.standard_normal((n, *space.shape)).astype(space.dtype)


@pytest.mark.parametrize("algo, obs_space, act_space", CASES)
def test_onnx_and_torchscript_act_as_the_policy_does(algo, obs_space, act_space):
    policy = trained_policy(algo, obs_space, act_space)
    module = acting_network(policy)
    obs = observations(obs_space)
    actions, _ = policy.act(obs, explore=False)
    outputs, _ = policy.forward(obs, None)
    session = ort.InferenceSession(onnx_bytes(module, example_batch(obs_space)))
    assert session.get_inputs()[0].type == ("tensor(uint8)" if obs_space.dtype == np.uint8 else "tensor(float)")
    names = [o.name for o in session.get_outputs()]
    assert names == ["action", *policy.acting_outputs()]
    got = dict(zip(names, session.run(None, {"obs": obs})))
    traced = torch.jit.load(io.BytesIO(torchscript_bytes(module, example_batch(obs_space))))
    with torch.no_grad():
        scripted = dict(zip(names, (t.numpy() for t in traced(torch.as_tensor(obs)))))
    for out in (got, scripted):
        if isinstance(act_space, spaces.Discrete):
            np.testing.assert_array_equal(out["action"], actions)
        else:
            assert out["action"].dtype == actions.dtype
            np.testing.assert_allclose(out["action"], actions, rtol=0, atol=1e-5)
        for name, value in outputs.items():
            np.testing.assert_allclose(out[name], value, rtol=1e-4, atol=1e-5)
    if isinstance(act_space, spaces.Discrete):  # the batch's greedy actions are not all one: a real check
        assert len(set(actions.tolist())) > 1


MAPF = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs",
                    "dhc_mapf_8x8.yaml")


def test_a_recurrent_policy_that_names_no_sampling_rule_is_refused():  # DHC's: its agents talk within a step
    policy = make_algorithm(load_config(MAPF)).make_policy(-1, 1, 0)
    with pytest.raises(ExportError, match="recurrent"):
        acting_network(policy)


CARTPOLE = "popgym.envs.position_only_cartpole:PositionOnlyCartPoleEasy"  # CartPole with the velocities hidden
REPEAT = "popgym.envs.repeat_previous:RepeatPreviousEasy"  # name the card seen some steps ago: 4 actions
RECURRENT = [("ppo", "lstm", CARTPOLE), ("impala", "gru", REPEAT), ("a2c", "gru", "Pendulum-v1"),
             ("r2d2", "gru", REPEAT)]
E = 4  # envs stepped side by side


def recurrent_policy(algo, core, env_id):
    """A greedy recurrent policy whose actions turn on its state. Random weights favour one discrete action
    throughout (the logits' constant part outweighs what the state adds): the head's bias is centred on the
    logits of the steps the policy takes."""
    spec = env_spec(env_id)
    policy = trained_policy(algo, spec.observation_space, spec.action_space, f"model.core={core}",
                            "model.hidden=[16]", "model.core_size=16")
    if isinstance(spec.action_space, spaces.Discrete):
        obs, states, _ = play(policy, env_id)
        out = policy.forward(obs, states)[0]
        bias = policy.net.pi_head.bias if hasattr(policy.net, "pi_head") else policy.net.head.advantage.bias
        with torch.no_grad():  # the policy's own module: what it acts with and what acting_network exports
            bias -= torch.as_tensor(out["out" if "out" in out else "q"].mean(0))
    return policy


def exported_steps(policy):
    """(obs, state) -> [action, *outputs, state_out] of the policy's ONNX file and of its TorchScript one."""
    space = policy.spec.observation_space
    module = acting_network(policy)
    session = ort.InferenceSession(onnx_bytes(module, example_batch(space)))
    assert [i.name for i in session.get_inputs()] == ["obs", "state"]
    assert [o.name for o in session.get_outputs()] == ["action", *policy.acting_outputs(), "state_out"]
    traced = torch.jit.load(io.BytesIO(torchscript_bytes(module, example_batch(space))))

    def scripted(obs, state):
        with torch.no_grad():
            return [t.numpy() for t in traced(torch.as_tensor(obs), torch.as_tensor(state))]

    return {"onnx": lambda obs, state: session.run(None, {"obs": obs, "state": state}), "torchscript": scripted}


def assert_same_actions(got, want):
    if want.dtype.kind == "f":  # a Box action: the float64 mapping of a float32 mean
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)


def play(policy, env_id, files=None, episodes=2):
    """(obs, state, action) of every greedy step of `policy` on E envs until each has ended `episodes`
    episodes. `files`: `exported_steps`, each stepped beside the policy as the docs say (zeros at an episode
    start, its state_out fed back) and checked against it at every step: its action, the state it acted from."""
    files = files or {}
    envs = VectorEnv(env_id, E, 0, training=False)
    policy.episodes_ended(np.ones(E, bool))  # fresh states, as each env's first episode starts
    states = {name: policy.initial_state(E) for name in files}
    ended, seen = np.zeros(E, int), []
    while ended.min() < episodes:
        obs = envs.obs.copy()
        actions, extras = policy.act(obs, explore=False)
        for name, step in files.items():
            np.testing.assert_allclose(states[name], extras["state"], rtol=0, atol=1e-4)
            out = step(obs, states[name])
            assert_same_actions(out[0], actions)
            states[name] = out[-1]
        seen.append((obs, extras["state"], actions))
        _, _, terminated, truncated, _ = envs.step(actions)
        done = terminated | truncated
        policy.episodes_ended(done)
        for name in files:
            states[name] = np.where(done[:, None, None], policy.initial_state(E), states[name])
        ended += done
    return [np.concatenate(x) for x in zip(*seen)]


@pytest.mark.parametrize("algo, core, env_id", RECURRENT)
def test_a_recurrent_export_steps_whole_episodes_as_the_policy_does(algo, core, env_id):
    policy = recurrent_policy(algo, core, env_id)
    files = exported_steps(policy)
    obs, _, actions = play(policy, env_id, files)
    # The state matters: the same observations, each from an episode start's state (a state not fed back,
    # or no state input at all), act otherwise at some steps.
    zeros = files["onnx"](obs, policy.initial_state(len(obs)))[0]
    if actions.dtype.kind == "f":
        assert np.abs(zeros - actions).max() > 1e-2
    else:
        assert len(set(actions.tolist())) > 1 and (zeros != actions).sum() >= 5


def run_dir(tmp_path, algo, *overrides):
    cfg = load_config(None, [f"algo={algo}", "env.id=CartPole-v1", *overrides])
    d = tmp_path / algo
    d.mkdir()
    (d / "config.yaml").write_text(dump_yaml(cfg))
    save_best(str(d), make_algorithm(cfg).make_learner("cpu").get_weights(), {"version": 3, "return_mean": 9.0})
    return str(d)


def test_distrl_export_writes_a_file_that_acts_as_the_best_checkpoint(tmp_path, capsys):
    d = run_dir(tmp_path, "ppo")
    path = str(tmp_path / "policy.onnx")
    assert main(["export", d, "--onnx", path, "--torchscript", str(tmp_path / "policy.pt")]) == 0
    assert "outputs action, out, value" in capsys.readouterr().out
    session = ort.InferenceSession(path)  # the three lines of docs/guides/external-simulators.md
    obs = np.array([[0.01, 0.2, -0.03, 0.1]], np.float32)
    action = session.run(["action"], {"obs": obs})[0][0]
    from distrl.api import _run_policy

    policy, _, meta = _run_policy(d, load_config(os.path.join(d, "config.yaml")))
    assert action == policy.act(obs, explore=False)[0][0] and meta["version"] == 3


def test_distrl_export_of_a_recurrent_run_takes_and_returns_the_state(tmp_path, capsys):
    d = run_dir(tmp_path, "ppo", "model.core=lstm", "model.core_size=8")
    path, pt = str(tmp_path / "policy.onnx"), str(tmp_path / "policy.pt")
    assert main(["export", d, "--onnx", path, "--torchscript", pt]) == 0
    assert "outputs action, out, value, state_out" in capsys.readouterr().out
    from distrl.api import _run_policy

    policy, _, _ = _run_policy(d, load_config(os.path.join(d, "config.yaml")))
    session, traced = ort.InferenceSession(path), torch.jit.load(pt)
    obs = np.array([[0.01, 0.2, -0.03, 0.1], [0.0, -0.5, 0.02, 0.3]], np.float32)
    state = np.zeros((2, 2, 8), np.float32)  # an episode's start: (batch, h and c, model.core_size)
    for _ in range(3):  # the docs' loop: each step's state_out is the next step's state
        action, *_, after = session.run(None, {"obs": obs, "state": state})
        outputs, want = policy.forward(obs, state)
        np.testing.assert_array_equal(action, outputs["out"].argmax(-1))
        np.testing.assert_allclose(after, want, rtol=0, atol=1e-5)
        with torch.no_grad():
            np.testing.assert_allclose(traced(torch.as_tensor(obs), torch.as_tensor(state))[-1].numpy(), want,
                                       rtol=0, atol=1e-5)
        state = after
    assert np.abs(state).min() > 0


@pytest.mark.parametrize("continuous", [False, True])
def test_distrl_export_of_a_mappo_run_writes_one_agents_actor(tmp_path, capsys, continuous):
    """The file takes one agent's row, `agent` and `own` (the central critic's inputs are the learner's only),
    and acts as the run's policy over steps of simple_spread."""
    from distrl.api import _run_policy
    from distrl.envs.multiagent_vector import MultiAgentVectorEnv

    spread, kwargs = "mpe2:simple_spread_v3", {"N": 3, "continuous_actions": continuous, "max_cycles": 25}
    d = run_dir(tmp_path, "mappo", f"env.id={spread}", f"env.kwargs={kwargs}", "mappo.central_input=state")
    cfg = load_config(os.path.join(d, "config.yaml"))
    rng = np.random.default_rng(1)  # weights with some noise: greedy actions that differ between agents
    weights = {k: v + 0.3 * rng.standard_normal(v.shape).astype(v.dtype)
               for k, v in make_algorithm(cfg).make_learner("cpu").get_weights().items()}
    save_best(d, weights, {"version": 3, "return_mean": -20.0})
    path = str(tmp_path / "actor.onnx")
    assert main(["export", d, "--onnx", path]) == 0
    outputs = ["out", "log_std"] if continuous else ["out"]
    assert f"outputs {', '.join(['action', *outputs])}" in capsys.readouterr().out
    session = ort.InferenceSession(path)
    assert [i.name for i in session.get_inputs()] == ["agent", "own"]
    assert [o.name for o in session.get_outputs()] == ["action", *outputs]
    policy, _, _ = _run_policy(d, cfg)
    envs = MultiAgentVectorEnv(spread, 2, 0, kwargs)
    for _ in range(5):
        rows = {"agent": np.tile(np.arange(3), 2), "own": envs.obs["obs"].reshape(6, -1)}
        got = dict(zip(["action", *outputs], session.run(None, rows)))
        with torch.no_grad():
            want = policy.net.actor_outputs({k: torch.as_tensor(v) for k, v in rows.items()})
        for name in outputs:
            np.testing.assert_allclose(got[name], want[name].numpy(), rtol=1e-4, atol=1e-5)
        actions, _ = policy.act(envs.obs, explore=False)
        np.testing.assert_allclose(got["action"], actions.reshape(6, *actions.shape[2:]), rtol=0, atol=1e-5)
        envs.step(actions)
    if not continuous:
        assert len(set(actions.reshape(-1).tolist())) > 1


@pytest.mark.parametrize("algo, args, message", [
    ("dhc", ["--onnx", "{tmp}/x.onnx"], "recurrent"),
    ("ppo", [], "--onnx"),
    ("ppo", ["--onnx", "{tmp}/no/such/dir/x.onnx"], "cannot write"),
])
def test_a_policy_or_a_path_that_cannot_export_is_one_line_and_exit_2(tmp_path, capsys, algo, args, message):
    d = run_dir(tmp_path, algo, *(["env.id=distrl.envs.mapf:MAPF"] if algo == "dhc" else []))
    assert main(["export", d, *[a.format(tmp=tmp_path) for a in args]]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not [f for f in os.listdir(tmp_path) if f != algo]  # nothing written


@pytest.mark.parametrize("env_id, leaves", [("CartPole-v1", {"": 4}),
                                             ("distrl.envs.testing:DictCartPole-v1", {"cart": 2, "pole": 2})])
def test_an_exported_policy_normalizes_raw_observations_as_the_run_did(tmp_path, env_id, leaves):
    """env.normalize.obs: the file takes the env's raw observations and applies the statistics the best
    checkpoint's weights came with (frozen, clipped), as the run's evaluator envs do; a Dict observation's
    float leaves each with their own (DictCartPole's uint8 `clock` as it is)."""
    from distrl import tree
    from distrl.api import export
    from distrl.envs.normalize import Normalization, RunningStats, normalized_leaves, obs_part

    cfg = load_config(None, ["algo=ppo", f"env.id={env_id}", "env.normalize.obs=true", "env.normalize.clip=2"])
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text(dump_yaml(cfg))
    rng = np.random.default_rng(0)
    weights = make_algorithm(cfg).make_learner("cpu").get_weights()
    for leaf, n in leaves.items():
        means, spreads = rng.normal(0.0, 2.0, n), rng.uniform(0.1, 4.0, n)
        weights.update(RunningStats.of(rng.normal(means, spreads, (500, n))).arrays(obs_part(leaf)))
    save_best(str(d), weights, {"version": 3, "return_mean": 9.0})
    path = str(tmp_path / "policy.onnx")
    export(str(d), onnx=path)
    from distrl.api import _run_policy

    policy, _, _ = _run_policy(str(d), cfg)
    normalization = Normalization(cfg.env.normalize, training=False, leaves=normalized_leaves(policy.acting_space))
    assert normalization.leaves == list(leaves)
    normalization.load(weights)
    raw = tree.sample(policy.acting_space, 64, seed=2)
    raw = tree.map(lambda x: (x * 3.0).astype(np.float32) if x.dtype.kind == "f" else x, raw)  # beyond the clip too
    want = policy.act(normalization.normalize(raw), explore=False)[0]
    got = ort.InferenceSession(path).run(["action"], dict(tree.named_leaves(raw)) if leaves.keys() != {""}
                                         else {"obs": raw})[0]
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(want, policy.act(raw, explore=False)[0])  # normalizing changes some actions


def test_a_structured_observation_exports_as_one_input_per_leaf_with_its_mask():
    space = spaces.Dict({"image": spaces.Box(0, 255, (10, 10, 3), np.uint8), "direction": spaces.Discrete(4),
                         "action_mask": spaces.MultiBinary(5)})
    policy = trained_policy("ppo", space, spaces.Discrete(5))
    module = acting_network(policy)
    from distrl import tree

    obs = tree.sample(space, 64, seed=3)
    obs["action_mask"][:, 0] = 1  # at least one legal action per row
    actions, _ = policy.act(obs, explore=False)
    assert all(obs["action_mask"][i, a] for i, a in enumerate(actions)) and len(set(actions.tolist())) > 1
    session = ort.InferenceSession(onnx_bytes(module, example_batch(space)))
    assert [i.name for i in session.get_inputs()] == ["action_mask", "direction", "image"]
    got = session.run(["action", "out"], {n: x for n, x in tree.named_leaves(obs)})
    np.testing.assert_array_equal(got[0], actions)
    outputs, _ = policy.forward(obs, None)
    np.testing.assert_allclose(got[1], outputs["out"], rtol=1e-4, atol=1e-3)


class TracedSlowly(nn.Module):
    """Its `act` says it is being traced, then waits (up to a second) for an export to finish."""

    def __init__(self, tracing: threading.Event, exported: threading.Event):
        super().__init__()
        self.linear, self.tracing, self.exported = nn.Linear(4, 2), tracing, exported

    def act(self, x):
        self.tracing.set()
        self.exported.wait(1.0)
        return self.linear(x)


def test_an_export_while_another_thread_traces_a_network_for_numpy_waits_for_it():
    """torch.fx swaps nn.Module.__call__ process-wide while it traces: an export's module calls on another
    thread (the external server's) would be taken into that trace and fail. The export waits its turn."""
    policy = trained_policy("ppo", VECTOR, spaces.Discrete(3))
    tracing, exported = threading.Event(), threading.Event()
    tracer = threading.Thread(target=numpy_program, args=(TracedSlowly(tracing, exported), "act",
                                                          np.zeros((2, 4), np.float32)))
    tracer.start()
    try:
        assert tracing.wait(10.0)
        model = onnx_bytes(acting_network(policy), example_batch(VECTOR))
    finally:
        exported.set()
        tracer.join(10.0)
    session = ort.InferenceSession(model)
    obs = observations(VECTOR)
    (actions, *_) = session.run(None, {session.get_inputs()[0].name: obs})
    np.testing.assert_array_equal(actions, policy.act(obs, explore=False)[0])
