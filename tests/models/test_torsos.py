"""The built-in torsos: shapes for every layout and dtype, uint8 scaling, layout and `auto` choices."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl.config.sections import ModelConfig
from distrl.models import TorsoError, make_torso
from distrl.models.torsos import image_layout, resolve_kind

B = 3


def image_space(shape, dtype):
    high = 255 if dtype == np.uint8 else 1.0
    return spaces.Box(0, high, shape, dtype)


def batch(space, seed=0):
    rng = np.random.default_rng(seed)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (B, *space.shape), dtype=np.uint8)
    return rng.random((B, *space.shape), dtype=np.float32)


# (kind, channels-first shape, model overrides): small images, and nature's smallest (36x36)
IMAGE_CASES = [("minatar", (4, 10, 10), {}), ("nature", (4, 36, 36), {}), ("impala", (3, 12, 12), {}),
               ("conv3x3", (2, 5, 5), {"conv_channels": [4, 6]}), ("minatar", (4, 10, 10), {"features": 32})]


@pytest.mark.parametrize("kind, chw, extra", IMAGE_CASES)
@pytest.mark.parametrize("layout", ["first", "last"])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_image_torsos_give_batch_by_out_features(kind, chw, extra, layout, dtype):
    shape = chw if layout == "first" else (*chw[1:], chw[0])
    space = image_space(shape, dtype)
    torch.manual_seed(0)
    torso = make_torso(space, ModelConfig(torso=kind, **extra))
    assert torso.input.channels_last == (layout == "last")
    out = torso(torch.as_tensor(batch(space)))
    assert out.dtype == torch.float32 and out.shape == (B, torso.out_features)
    assert isinstance(torso.out_features, int)
    if "features" in extra:
        assert torso.out_features == extra["features"]


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("shape", [(5,), (2, 3)])
def test_mlp_torso_flattens_and_gives_the_last_hidden_width(dtype, shape):
    space = spaces.Box(0, 255 if dtype == np.uint8 else 1.0, shape, dtype)
    torso = make_torso(space, ModelConfig(torso="mlp", hidden=[8, 6], activation="tanh"))
    out = torso(torch.as_tensor(batch(space)))
    assert out.shape == (B, 6) and torso.out_features == 6
    assert out.abs().max() < 1  # the activation comes after the last layer too
    flat = make_torso(space, ModelConfig(torso="mlp", hidden=[]))
    assert flat.out_features == int(np.prod(shape))
    assert flat(torch.as_tensor(batch(space))).shape == (B, flat.out_features)


@pytest.mark.parametrize("kind, shape", [("mlp", (6,)), ("minatar", (10, 10, 4)), ("conv3x3", (3, 5, 5)),
                                         ("impala", (3, 12, 12))])
def test_uint8_frames_are_scaled_inside_the_network_bit_for_bit(kind, shape):
    """A uint8 torso on frames equals the same weights on frames / 255 given as float32."""
    u8, f32 = image_space(shape, np.uint8), image_space(shape, np.float32)
    model = ModelConfig(torso=kind, hidden=[8], conv_channels=[4])
    a, b = make_torso(u8, model), make_torso(f32, model)
    b.load_state_dict(a.state_dict())
    frames = batch(u8)
    with torch.no_grad():
        from_bytes = a(torch.as_tensor(frames))
        from_floats = b(torch.as_tensor(frames.astype(np.float32) / 255))
    assert torch.equal(from_bytes, from_floats)


def test_all_256_byte_values_scale_to_the_float_frame_exactly():
    torso = make_torso(spaces.Box(0, 255, (256,), np.uint8), ModelConfig(torso="mlp", hidden=[]))
    frame = np.arange(256, dtype=np.uint8)[None]
    np.testing.assert_array_equal(torso(torch.as_tensor(frame)).numpy(), frame.astype(np.float32) / 255)


def test_bool_observations_become_zeros_and_ones():
    torso = make_torso(spaces.Box(0, 1, (4,), bool), ModelConfig(torso="mlp", hidden=[]))
    obs = np.array([[True, False, True, True]])
    np.testing.assert_array_equal(torso(torch.as_tensor(obs)).numpy(), [[1.0, 0.0, 1.0, 1.0]])



@pytest.mark.parametrize("kind, shape, nhwc", [("nature", (4, 36, 36), True), ("impala", (3, 12, 12), True),
                                               ("nature", (36, 36, 4), True), ("conv3x3", (7, 9, 9), False),
                                               ("minatar", (10, 10, 4), True)])
def test_large_frame_torsos_convolve_channels_last_in_memory_with_the_same_outputs(kind, shape, nhwc):
    """Nature and IMPALA convolve a (B, C, H, W) batch laid out channels last (oneDNN's fast layout on CPU);
    DHC's 3x3 views stay channels first (slower that way round); an HWC env's frames are channels last
    already. The layout changes no output beyond float32 rounding."""
    space = image_space(shape, np.uint8)
    torso = make_torso(space, ModelConfig(torso=kind, conv_channels=[4]))
    seen = []
    first_conv = next(m for m in torso.convs.modules() if isinstance(m, torch.nn.Conv2d))
    first_conv.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    frames = torch.as_tensor(batch(space))
    with torch.no_grad():
        out = torso(frames)
        x = seen[0]
        assert x.shape == (B, *torso.input.chw)
        assert x.is_contiguous(memory_format=torch.channels_last) == nhwc
        plain = torso.convs(x.contiguous()).flatten(1)  # the same batch, channels first in memory
        ref = torso.fc(plain) if torso.fc is not None else plain
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("kind, shape", [("nature", (4, 36, 36)), ("minatar", (10, 10, 4)), ("impala", (3, 12, 12))])
def test_image_torsos_keep_their_linear_weight_input_major_through_loads_and_steps(kind, shape):
    """The fc weight stays (out, in) with the input axis contiguous (MKL's fast layout for a few rows)
    after a state_dict load, numpy weights and an Adam step, takes a gradient made elsewhere in its own
    layout, and computes what a plain Linear does."""
    from distrl.models.weights import laid_out_as, load_numpy_weights, to_numpy_weights

    space = image_space(shape, np.uint8)
    torso, other = make_torso(space, ModelConfig(torso=kind)), make_torso(space, ModelConfig(torso=kind))
    weight = torso.fc[0].weight
    input_major = lambda w: w.t().is_contiguous() and not w.is_contiguous()  # noqa: E731
    torso.load_state_dict(other.state_dict())
    load_numpy_weights(torso, to_numpy_weights(other))
    assert input_major(weight) and torso.fc[0].weight is weight
    assert to_numpy_weights(torso)["fc.0.weight"].shape == (torso.out_features, weight.shape[1])
    frames = torch.as_tensor(batch(space))
    opt = torch.optim.Adam(torso.parameters(), lr=1e-3, fused=True)
    torso(frames).square().mean().backward()
    assert input_major(weight.grad)
    # A gradient from elsewhere (a gradient worker's, A3C's) as a row-major array: laid_out_as lays it out as
    # the weight is, which the fused Adam needs (it walks both in memory order).
    twin = make_torso(space, ModelConfig(torso=kind))
    twin.load_state_dict(torso.state_dict())
    twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-3, fused=True)
    for p, q in zip(torso.parameters(), twin.parameters()):
        q.grad = laid_out_as(q, p.grad.detach().contiguous().numpy())
    assert input_major(twin.fc[0].weight.grad) and torch.equal(twin.fc[0].weight.grad, weight.grad)
    before = weight.detach().clone()
    opt.step()
    twin_opt.step()
    assert input_major(weight) and not torch.equal(weight, before)
    assert all(torch.equal(p, q) for p, q in zip(torso.parameters(), twin.parameters()))
    with torch.no_grad():
        features = torso.convs(torso.input(frames)).flatten(1)
        plain = torch.relu(features @ weight.contiguous().t() + torso.fc[0].bias)
        torch.testing.assert_close(torso(frames), plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, layout", [((4, 84, 84), "first"), ((84, 84, 4), "last"), ((10, 10, 4), "last"),
                                           ((7, 9, 9), "first"), ((10, 10, 10), "last")])
def test_image_layout_finds_the_channel_axis(shape, layout):
    assert image_layout(shape) == layout
    assert image_layout(shape, "first") == "first" and image_layout(shape, "last") == "last"  # an explicit setting wins


def test_explicit_channels_override_the_guess():
    # (10, 10, 4) would be channels last; told "first", the torso reads 10 channels of 10x4 images.
    torso = make_torso(image_space((10, 10, 4), np.float32), ModelConfig(torso="conv3x3", channels="first",
                                                                       conv_channels=[2]))
    assert torso.input.chw == (10, 10, 4) and torso.out_features == 2 * 10 * 4


@pytest.mark.parametrize("shape, kind", [((8,), "mlp"), ((2, 3), "mlp"), ((4, 10, 10), "minatar"),
                                         ((10, 10, 4), "minatar"), ((32, 32, 3), "minatar"),
                                         ((4, 84, 84), "nature"), ((84, 84, 4), "nature"), ((3, 40, 40), "nature")])
def test_auto_picks_mlp_for_vectors_minatar_for_small_images_nature_otherwise(shape, kind):
    space = image_space(shape, np.uint8)
    assert resolve_kind(space, ModelConfig(torso="auto")) == kind
    torso = make_torso(space, ModelConfig(torso="auto", hidden=[8]))
    assert torso.out_features == {"mlp": 8, "minatar": 128, "nature": 512}[kind]


def test_an_algorithms_image_choice_replaces_auto_for_images_only():
    model = ModelConfig(torso="auto")
    assert resolve_kind(image_space((4, 84, 84), np.uint8), model, "conv3x3") == "conv3x3"
    assert resolve_kind(spaces.Box(-1, 1, (4,)), model, "conv3x3") == "mlp"
    assert resolve_kind(image_space((4, 84, 84), np.uint8), ModelConfig(torso="impala"), "conv3x3") == "impala"


@pytest.mark.parametrize("shape", [(4, 35, 35), (20, 20, 3), (3, 36, 20)])
def test_nature_refuses_images_smaller_than_36x36(shape):
    with pytest.raises(TorsoError, match=r"^config key 'model.torso': nature needs images of at least 36x36"):
        make_torso(image_space(shape, np.uint8), ModelConfig(torso="nature"))


def test_image_torsos_refuse_vectors_and_non_box_spaces():
    with pytest.raises(TorsoError, match="model.torso.*minatar needs an image observation"):
        make_torso(spaces.Box(-1, 1, (6,)), ModelConfig(torso="minatar"))
    with pytest.raises(TorsoError, match="model.torso.*needs a Box observation space"):
        make_torso(spaces.Discrete(4), ModelConfig(torso="mlp"))
