"""The numpy program of a network's acting method: checked once here for every algorithm's network.

Each algorithm's policy acts through `NetworkPolicy.run`; where the network's method has a numpy
program (linear layers, activations, reshapes), it is what runs, and it must give the torch module's
outputs. Networks with ops it does not take (recurrent cores, convolutions) run torch.
"""
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from distrl.config import load_config
from distrl.core import EnvSpec
from distrl.envs import env_spec
from distrl.models import numpy_run
from distrl.models.numpy_run import ATOL, RTOL, numpy_program
from distrl.roles.factory import make_algorithm

FEEDFORWARD = [  # (algo, env, overrides, the method its policy acts through)
    ("apex_dqn", "CartPole-v1", [], "forward"),
    ("apex_dqn", "CartPole-v1", ["apex_dqn.dueling=false"], "forward"),
    ("ppo", "CartPole-v1", [], "act_outputs"),
    ("ppo", "CartPole-v1", ["ppo.shared_torso=true", "model.activation=tanh"], "act_outputs"),
    ("ppo", "Pendulum-v1", [], "act_outputs"),
    ("a2c", "CartPole-v1", ["model.activation=silu"], "act_outputs"),
    ("a3c", "CartPole-v1", [], "act_outputs"),
    ("impala", "LunarLander-v3", ["model.activation=elu"], "act_outputs"),
    ("sac", "Pendulum-v1", [], "forward"),
    ("bc", "CartPole-v1", [], "forward"),
    ("apex_dqn", "CartPole-v1", ["model.torso=tests.models.user_torsos:Factory"], "forward"),
    ("ppo", "CartPole-v1", ["model.torso=tests.runtime.custom_torso:LayerNormTorso"], "act_outputs"),
]


def perturbed_policy(algo_name, env_id, overrides, seed=0):
    """A worker's policy holding a learner's weights moved away from their initial values."""
    algo = make_algorithm(load_config(None, [f"algo={algo_name}", *overrides]), env_spec(env_id))
    learner = algo.make_learner("cpu")
    policy = algo.make_policy(0, 1, 0)
    weights = learner.get_weights()
    rng = np.random.default_rng(seed)
    policy.set_weights({k: (v + 0.3 * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in weights.items()}, 1)
    return algo, policy


def observations(spec, rows, seed=1):
    space = spec.observation_space
    rng = np.random.default_rng(seed)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (rows, *space.shape), dtype=np.uint8)
    return rng.normal(size=(rows, *space.shape)).astype(space.dtype)


def assert_close(out, ref):
    if isinstance(ref, dict):
        assert out.keys() == ref.keys()
        for k in ref:
            assert_close(out[k], ref[k])
    elif isinstance(ref, (tuple, list)):
        assert len(out) == len(ref)
        for o, r in zip(out, ref):
            assert_close(o, r)
    else:
        ref = ref.detach().numpy()
        assert isinstance(out, np.ndarray) and out.dtype == ref.dtype and out.shape == ref.shape
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


def torch_outputs(policy, method, obs):
    with torch.no_grad():
        return getattr(policy.net, method)(torch.as_tensor(obs))


@pytest.mark.parametrize("algo_name, env_id, overrides, method", FEEDFORWARD)
def test_every_feedforward_network_acts_through_its_numpy_program(algo_name, env_id, overrides, method):
    algo, policy = perturbed_policy(algo_name, env_id, overrides)
    policy.observe_steps(10**9)  # past any uniform-random warm-up: the network acts
    obs = observations(algo.spec, 8)
    policy.act(obs, explore=False)
    assert policy.programs.get(method) is not None, f"{algo_name} acted through torch"
    for rows in (8, 1, 0):
        assert_close(policy.run(method, obs[:rows]), torch_outputs(policy, method, obs[:rows]))


@pytest.mark.parametrize("algo_name, env_id, overrides", [
    ("apex_dqn", "MinAtar/Breakout-v1", []),  # a convolution
    ("ppo", "MinAtar/Breakout-v1", []),
])
def test_networks_with_ops_it_does_not_take_run_torch(algo_name, env_id, overrides):
    algo, policy = perturbed_policy(algo_name, env_id, overrides)
    obs = observations(algo.spec, 4)
    method = "forward" if algo_name == "apex_dqn" else "act_outputs"
    out = policy.run(method, obs)
    assert policy.programs[method] is None
    ref = torch_outputs(policy, method, obs)
    ref = {k: v.numpy() for k, v in ref.items()} if isinstance(ref, dict) else ref.numpy()
    np.testing.assert_equal(out, ref)  # torch's own outputs, bit for bit


def test_weights_loaded_after_the_program_was_made_reach_it():
    algo, policy = perturbed_policy("ppo", "CartPole-v1", [])
    obs = observations(algo.spec, 5)
    before = policy.run("act_outputs", obs)
    program = policy.programs["act_outputs"]
    new = {k: v + 0.5 for k, v in policy.net.state_dict().items()}
    policy.set_weights({k: v.numpy() for k, v in new.items()}, 2)
    after = policy.run("act_outputs", obs)
    assert policy.programs["act_outputs"] is program
    assert not np.allclose(before["out"], after["out"])
    assert_close(after, torch_outputs(policy, "act_outputs", obs))


class Sorted(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 4)

    def forward(self, x):
        return torch.sort(self.layer(x), dim=-1).values


class Branchy(nn.Module):
    """Control flow on values: fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 4)

    def forward(self, x):
        return self.layer(x) if x.sum() > 0 else -self.layer(x)


@pytest.mark.parametrize("module", [Sorted(), Branchy(), nn.GRUCell(3, 4), nn.Conv1d(3, 4, 1)])
def test_an_op_it_does_not_take_gives_none(module):
    x = np.ones((2, 3), np.float32)
    assert numpy_program(module, "forward", x) is None


def test_a_program_that_disagrees_with_torch_on_its_first_input_is_refused(monkeypatch):
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    assert numpy_program(net, "forward", x) is not None
    monkeypatch.setitem(numpy_run._MODULES, nn.Tanh, lambda m: np.sin)
    assert numpy_program(net, "forward", x) is None


def test_uint8_inputs_are_scaled_as_the_torso_scales_them():
    spec = EnvSpec(spaces.Box(0, 255, (6,), np.uint8), spaces.Discrete(3))
    algo = make_algorithm(load_config(None, ["algo=apex_dqn"]), spec)
    net = algo.build_network().eval()
    x = np.random.default_rng(0).integers(0, 256, (4, 6), dtype=np.uint8)
    program = numpy_program(net, "forward", x)
    assert program is not None
    with torch.no_grad():
        np.testing.assert_allclose(program(x), net(torch.as_tensor(x)).numpy(), rtol=RTOL, atol=ATOL)
