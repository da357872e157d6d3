"""The torso of a structured observation: an encoder per leaf, concatenated, then the MLP."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl import tree
from distrl.config.sections import ModelConfig
from distrl.models import TorsoError, check_torso, make_torso
from distrl.models.multi_input import MultiInputTorso
from distrl.models.torsos import ConvTorso

SPACE = spaces.Dict({"screen": spaces.Box(0, 255, (40, 40, 3), np.uint8), "vars": spaces.Box(-1, 1, (2,), np.float32),
                     "dir": spaces.Discrete(4, start=1), "keys": spaces.MultiDiscrete([2, 3]),
                     "action_mask": spaces.MultiBinary(5)})


def test_each_leaf_gets_the_encoder_its_space_asks_for():
    torso = make_torso(SPACE, ModelConfig(hidden=[32], encoders={"screen": "nature"}))
    assert isinstance(torso, MultiInputTorso) and torso.names == ["dir", "keys", "screen", "vars"]
    widths = [e.out_features for e in torso.encoders]
    assert widths == [4, 5, 512, 2] and torso.out_features == 32  # the mask is no input
    check_torso(torso, SPACE, "auto")
    auto = make_torso(SPACE, ModelConfig(hidden=[]))
    assert isinstance(auto.encoders[2], ConvTorso) and auto.out_features == 4 + 5 + 512 + 2


def test_discrete_leaves_are_one_hot_from_their_start():
    torso = make_torso(spaces.Dict({"d": spaces.Discrete(3, start=1)}), ModelConfig(hidden=[]))
    out = torso({"d": torch.tensor([1, 3])})
    assert out.tolist() == [[1, 0, 0], [0, 0, 1]]


def test_the_mask_does_not_change_the_features():
    torso = make_torso(SPACE, ModelConfig(hidden=[8]))
    batch = tree.map(torch.as_tensor, tree.sample(SPACE, 3))
    other = {**batch, "action_mask": 1 - batch["action_mask"]}
    assert torch.equal(torso(batch), torso(other))


def test_encoders_that_do_not_fit_are_one_line():
    with pytest.raises(TorsoError, match="model.encoders.vars: only image leaves take an encoder"):
        make_torso(SPACE, ModelConfig(encoders={"vars": "nature"}))
    with pytest.raises(TorsoError, match="model.encoders names 'scren', which the observation lacks"):
        make_torso(SPACE, ModelConfig(encoders={"scren": "nature"}))
    small = spaces.Dict({"img": spaces.Box(0, 255, (7, 7, 3), np.uint8)})
    with pytest.raises(TorsoError, match="model.encoders.img: nature needs images of at least 36x36"):
        make_torso(small, ModelConfig(encoders={"img": "nature"}))


def test_a_symbolic_grid_s_codes_go_in_as_they_are_and_flat_scales_them_as_intensities():
    grid = spaces.Dict({"image": spaces.Box(0, 255, (2, 2, 3), np.uint8)})
    obs = {"image": torch.tensor([[[[10, 5, 2], [1, 0, 0]], [[2, 5, 0], [8, 1, 1]]]], dtype=torch.uint8)}
    codes = make_torso(grid, ModelConfig(hidden=[], encoders={"image": "codes"}))
    assert codes(obs).tolist() == [[10, 5, 2, 1, 0, 0, 2, 5, 0, 8, 1, 1]]
    flat = make_torso(grid, ModelConfig(hidden=[], encoders={"image": "flat"}))
    assert torch.allclose(flat(obs) * 255, codes(obs))
    with pytest.raises(TorsoError, match="model.encoders.image: an image leaf takes one of .*, flat or codes, not 'pixels'"):
        make_torso(spaces.Dict({"image": spaces.Box(0, 255, (40, 40, 3), np.uint8)}),
                   ModelConfig(encoders={"image": "pixels"}))


def test_the_first_layer_looks_up_one_hot_codes_as_the_product_would_compute_them():
    small = spaces.Dict({"vars": spaces.Box(-1, 1, (2,), np.float32), "dir": spaces.Discrete(4, start=1),
                         "keys": spaces.MultiDiscrete([2, 3]), "action_mask": spaces.MultiBinary(5)})
    torch.manual_seed(0)
    torso = make_torso(small, ModelConfig(hidden=[16, 8]))
    assert torso.lookup
    batch = tree.map(torch.as_tensor, tree.sample(small, 64))
    leaves = [x for n, x in tree.named_leaves(batch) if n != tree.MASK_KEY]
    product = torso.layers(torch.cat([e(x) for e, x in zip(torso.encoders, leaves)], dim=1))
    looked_up = torso(batch)
    torch.testing.assert_close(looked_up, product)
    grads = [torch.autograd.grad(out.square().sum(), list(torso.parameters())) for out in (looked_up, product)]
    for a, b in zip(*grads):  # the same parameters get the same gradients
        torch.testing.assert_close(a, b)
    assert not make_torso(small, ModelConfig(hidden=[])).lookup  # no layer to look up: the codes are the features
