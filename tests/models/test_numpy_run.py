"""The numpy program of a network's acting method: checked once here for every algorithm's network.

Each algorithm's policy acts through `NetworkPolicy.run`; where the network's method has a numpy
program (linear layers, activations, reshapes; on a Dict or Tuple observation its leaves' one-hot and
flat encoders and the action mask too), it is what runs, and it must give the torch module's outputs.
Networks with ops it does not take (recurrent cores, convolutions) run torch.
"""
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from distrl import tree
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
    # Structured observations (`SPECS`): one-hot Discrete leaves, flat uint8 images, the action mask.
    ("ppo", "masked-taxi", [], "act_outputs"),
    ("a2c", "masked-taxi", ["a2c.shared_torso=true"], "act_outputs"),
    ("impala", "masked-taxi", [], "act_outputs"),
    ("apex_dqn", "masked-taxi", [], "forward"),
    ("apex_dqn", "masked-taxi", ["apex_dqn.dueling=false"], "forward"),
    ("ppo", "minigrid", ["model.encoders={image: flat}"], "act_outputs"),
    ("apex_dqn", "minigrid", ["model.encoders={image: flat}"], "forward"),
    ("ppo", "tuple", [], "act_outputs"),
]

SPECS = {  # structured observations, by the names the cases above give them
    # Taxi with its action mask: the taxi's state a Discrete leaf.
    "masked-taxi": EnvSpec(spaces.Dict({"obs": spaces.Discrete(500), "action_mask": spaces.MultiBinary(6)}),
                           spaces.Discrete(6)),
    # MiniGrid's: the encoded 7x7 view (uint8) and the agent's direction, with a mask of its 7 actions.
    "minigrid": EnvSpec(spaces.Dict({"image": spaces.Box(0, 255, (7, 7, 3), np.uint8),
                                     "direction": spaces.Discrete(4),
                                     "action_mask": spaces.MultiBinary(7)}), spaces.Discrete(7)),
    # A Tuple: a float vector, a Discrete leaf that starts at 2, a MultiDiscrete.
    "tuple": EnvSpec(spaces.Tuple((spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(5, start=2),
                                   spaces.MultiDiscrete([3, 4]))), spaces.Discrete(3)),
}


def perturbed_policy(algo_name, env_id, overrides, seed=0):
    """A worker's policy holding a learner's weights moved away from their initial values."""
    spec = SPECS[env_id] if env_id in SPECS else env_spec(env_id)
    algo = make_algorithm(load_config(None, [f"algo={algo_name}", *overrides]), spec)
    learner = algo.make_learner("cpu")
    policy = algo.make_policy(0, 1, 0)
    weights = learner.get_weights()
    rng = np.random.default_rng(seed)
    policy.set_weights({k: (v + 0.3 * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in weights.items()}, 1)
    return algo, policy


def observations(spec, rows, seed=1):
    space = spec.observation_space
    if tree.is_structured(space):
        return tree.sample(space, rows, seed)
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
        return getattr(policy.net, method)(tree.map(torch.as_tensor, obs))


@pytest.mark.parametrize("algo_name, env_id, overrides, method", FEEDFORWARD)
def test_every_feedforward_network_acts_through_its_numpy_program(algo_name, env_id, overrides, method):
    algo, policy = perturbed_policy(algo_name, env_id, overrides)
    policy.observe_steps(10**9)  # past any uniform-random warm-up: the network acts
    obs = observations(algo.spec, 8)
    policy.act(obs, explore=False)
    assert policy.programs.get(method) is not None, f"{algo_name} acted through torch"
    # No zero rows for a structured observation: its torso's reshape of an empty batch fails in torch too.
    for rows in (8, 1) if env_id in SPECS else (8, 1, 0):
        part = tree.index(obs, slice(rows))
        assert_close(policy.run(method, part), torch_outputs(policy, method, part))


@pytest.mark.parametrize("algo_name, env_id, overrides", [
    ("apex_dqn", "MinAtar/Breakout-v1", []),  # a convolution
    ("ppo", "MinAtar/Breakout-v1", []),
    ("ppo", "minigrid", []),  # an image leaf through its image torso
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


class WhereMasked(nn.Module):
    """A tree input masked by torch.where, with a comparison and a float scalar: the ops `apply_mask` has
    beside it, as a user's network may spell them."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 4)

    def forward(self, obs):
        return torch.where(obs["action_mask"].bool(), self.layer(obs["x"]), -1e9)


def test_a_tree_input_runs_in_numpy_and_takes_its_own_structure_only():
    rng = np.random.default_rng(0)
    net = WhereMasked()
    obs = {"x": rng.normal(size=(5, 3)).astype(np.float32), "action_mask": rng.integers(0, 2, (5, 4), dtype=np.int8)}
    program = numpy_program(net, "forward", obs)
    assert program is not None
    with torch.no_grad():
        assert_close(program(obs), net(tree.map(torch.as_tensor, obs)))
    with pytest.raises(ValueError, match="numpy program of inputs shaped"):
        program({"x": obs["x"], "mask": obs["action_mask"]})
