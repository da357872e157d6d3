"""K copies of a torso as one module (SAC's twin critics): independent weights, (K, B, F) outputs, and a
`detach_params` mode whose gradient reaches only the input."""
import numpy as np
import torch
from gymnasium import spaces
from torch.nn import functional as F

from distrl.config.sections import ModelConfig
from distrl.models import make_ensemble
from distrl.models.ensemble import Copies, StackedMLP

VECTOR = spaces.Box(-1.0, 1.0, (5,), np.float32)
IMAGE = spaces.Box(0, 255, (2, 5, 5), np.uint8)


def obs(space, rows=4, seed=0):
    rng = np.random.default_rng(seed)
    if space.dtype == np.uint8:
        return torch.as_tensor(rng.integers(0, 256, (rows, *space.shape), dtype=np.uint8))
    return torch.as_tensor(rng.standard_normal((rows, *space.shape), dtype=np.float32))


def copy_k(ens: StackedMLP, k: int, x: torch.Tensor) -> torch.Tensor:
    """Copy k as a plain MLP: its own slice of every stacked layer."""
    for layer in ens.layers:
        x = torch.relu(F.linear(x, layer.weight[k].T, layer.bias[k, 0]))
    return x


def test_stacked_mlp_copies_have_their_own_weights():
    torch.manual_seed(0)
    ens = make_ensemble(VECTOR, ModelConfig(torso="auto", hidden=[8, 6]), copies=3)
    assert isinstance(ens, StackedMLP) and ens.out_features == 6
    x = obs(VECTOR)
    with torch.no_grad():
        out = ens(x)
        assert out.shape == (3, 4, 6)
        for k in range(3):
            torch.testing.assert_close(out[k], copy_k(ens, k, x), rtol=1e-6, atol=1e-6)
        assert not torch.allclose(out[0], out[1])  # initialised independently
        ens.layers[0].weight[0].add_(1.0)  # change copy 0 only
        after = ens(x)
    assert not torch.equal(after[0], out[0])
    assert torch.equal(after[1:], out[1:])


def test_detach_params_lets_the_gradient_reach_only_the_input():
    torch.manual_seed(0)
    ens = make_ensemble(VECTOR, ModelConfig(torso="mlp", hidden=[8]), copies=2)
    x = obs(VECTOR).requires_grad_(True)
    out = ens(x, detach_params=True)
    with torch.no_grad():
        assert torch.equal(out, ens(x))  # the same values
    out.square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is None for p in ens.parameters())
    ens(x).square().sum().backward()  # without it, the parameters get their gradient
    assert all(p.grad is not None for p in ens.parameters())


def test_copies_of_a_non_mlp_torso():
    torch.manual_seed(0)
    ens = make_ensemble(IMAGE, ModelConfig(torso="conv3x3", conv_channels=[3]), copies=2)
    assert isinstance(ens, Copies) and ens.out_features == 3 * 5 * 5
    x = obs(IMAGE)
    with torch.no_grad():
        out = ens(x)
        assert out.shape == (2, 4, 75)
        for k, torso in enumerate(ens.torsos):
            assert torch.equal(out[k], torso(x))
        assert not torch.equal(out[0], out[1])
    # detach_params: same values, the gradient reaches a float input and no parameter.
    xf = (x.float() / 255).requires_grad_(True)
    float_ens = make_ensemble(spaces.Box(0.0, 1.0, IMAGE.shape, np.float32), ModelConfig(torso="conv3x3",
                                                                                    conv_channels=[3]), copies=2)
    detached = float_ens(xf, detach_params=True)
    assert torch.equal(detached.detach(), float_ens(xf).detach())
    detached.sum().backward()
    assert xf.grad.abs().sum() > 0 and all(p.grad is None for p in float_ens.parameters())
