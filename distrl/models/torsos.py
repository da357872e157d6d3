"""The torso factory: observation space + `model` section -> an `nn.Module` with an int `out_features`.

Every algorithm builds its networks as `head(torso(obs))`, so a new layer type, architecture or a
user's own network is written once and reaches every algorithm. A torso takes observations as they
are stored (uint8 frames stay uint8 until here) and returns (B, out_features) float32 features:
`InputScale` turns uint8 into [0, 1] floats and bools into 0/1 inside the network.

Image torsos (a Box of rank 3, channels first or last):

- `minatar`: Young & Tian's MinAtar network (2019): Conv 16 3x3 stride 1, ReLU, Linear 128, ReLU.
- `nature`: the DQN Nature CNN (Mnih et al., 2015): Conv 32 8x8 s4, 64 4x4 s2, 64 3x3 s1, Linear 512.
- `impala`: IMPALA's ResNet (Espeholt et al., 2018): per stage of 16, 32, 32 channels a 3x3 conv, a
  3x3 max-pool of stride 2 and two residual blocks; ReLU, Linear 256.
- `conv3x3`: padded 3x3 convs + ReLU (`model.conv_channels`), flattened: DHC's field-of-view encoder.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU}
IMAGE_TORSOS = ("minatar", "nature", "impala", "conv3x3")
STANDARD_FEATURES = {"minatar": 128, "nature": 512, "impala": 256}
NHWC_TORSOS = ("nature", "impala")


class InputScale(nn.Module):
    """Stored observations -> float32: uint8 frames to [0, 1], everything else cast (bools to 0/1)."""

    def __init__(self, dtype: np.dtype):
        super().__init__()
        self.divisor = 255.0 if np.dtype(dtype) == np.uint8 else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(torch.float32)
        if self.divisor is None:
            return x
        # A division, not a multiply by 1/255: that rounds 126 of the 256 values differently from the
        # frame a user scales by hand (frame / 255). In place on the float copy: a learner's batch of frames
        # is tens of MB, and a second buffer of that size costs more than the division.
        return x.div_(self.divisor) if x is not obs else x / self.divisor


def mlp(sizes: list[int], activation: type[nn.Module] = nn.ReLU, last_activation: bool = True) -> nn.Sequential:
    """Linear layers with `activation` between them and, optionally, after the last."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(activation())
    return nn.Sequential(*layers)


class MLPTorso(nn.Module):
    """Flatten, then `hidden` Linear layers each followed by the activation."""

    def __init__(self, space: spaces.Box, hidden: list[int], activation: str = "relu"):
        super().__init__()
        in_features = int(np.prod(space.shape))
        self.scale = InputScale(space.dtype)
        self.layers = mlp([in_features, *hidden], ACTIVATIONS[activation])
        self.out_features = int(hidden[-1]) if hidden else in_features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.scale.forward(obs).flatten(1)
        # Each layer's own forward, not its __call__: for a few rows of a small MLP (a worker's step)
        # the hook dispatch per layer costs as much as the layer.
        for layer in self.layers:
            x = layer.forward(x)
        return x


def image_layout(shape: tuple, channels: str = "auto") -> str:
    """"first" (C, H, W) or "last" (H, W, C). auto: the odd axis out of two equal ones holds the channels
    (square images, the common case); otherwise the smaller end; gymnasium's HWC when all three are equal."""
    if channels != "auto":
        return channels
    a, b, c = shape
    if b == c and a != b:
        return "first"
    if a == b and c != a:
        return "last"
    return "first" if a < c else "last"


class ImageInput(nn.Module):
    """Scales an image batch and puts its channels first, as torch's convs want them. With `nhwc` the
    batch is channels last in memory (shape (B, C, H, W), strides of (B, H, W, C)), whatever the env's layout."""

    def __init__(self, space: spaces.Box, channels: str = "auto", nhwc: bool = False):
        super().__init__()
        self.scale = InputScale(space.dtype)
        self.channels_last = image_layout(tuple(space.shape), channels) == "last"  # the env's (H, W, C) frames
        self.nhwc = nhwc  # the memory layout handed to the convs
        a, b, c = (int(n) for n in space.shape)
        self.chw = (c, a, b) if self.channels_last else (a, b, c)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = obs.permute(0, 3, 1, 2)  # channels last in memory already
        else:  # reordered before scaling: uint8 frames are 4x fewer bytes to move
            x = obs.contiguous(memory_format=torch.channels_last) if self.nhwc else obs
        return self.scale(x)


def conv_out(module: nn.Module, chw: tuple) -> int:
    """Features a conv stack gives for one (C, H, W) input: found by running it once."""
    with torch.no_grad():
        return int(module(torch.zeros(1, *chw)).flatten(1).shape[1])


class ConvTorso(nn.Module):
    """An image input, a conv stack, flatten, and optionally a Linear + ReLU to `features` (`nhwc`: see
    ImageInput)."""

    def __init__(self, space: spaces.Box, convs: nn.Module, features: int | None, channels: str = "auto",
                 nhwc: bool = False):
        super().__init__()
        self.input = ImageInput(space, channels, nhwc)
        self.convs = convs
        flat = conv_out(convs, self.input.chw)
        self.fc = nn.Sequential(input_major_(nn.Linear(flat, features)), nn.ReLU()) if features else None
        self.out_features = int(features) if features else flat

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.convs(self.input(obs)).flatten(1)
        return self.fc(x) if self.fc is not None else x


def input_major_(layer: nn.Linear) -> nn.Linear:
    """Stores `layer`'s (out, in) weight with its input axis contiguous: MKL multiplies a worker's few
    rows by a weight laid out so up to 2x faster on CPU, and a learner's batch within a few percent
    (`python -m bench.linear_layout`: the Nature CNN's 3136 -> 512 layer for 8 frames, 424 against 838 us).
    Loading a state_dict copies into the weight and keeps the layout; autograd's gradient takes it too,
    and one made elsewhere must be put into it (`weights.laid_out_as`)."""
    layer.weight.data = layer.weight.data.t().contiguous().t()
    return layer


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def impala_stack(in_channels: int, stages: tuple[int, ...] = (16, 32, 32)) -> nn.Sequential:
    layers: list[nn.Module] = []
    for out in stages:
        layers += [nn.Conv2d(in_channels, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                   ResidualBlock(out), ResidualBlock(out)]
        in_channels = out
    return nn.Sequential(*layers, nn.ReLU())


def conv_stack(kind: str, in_channels: int, conv_channels: list[int]) -> nn.Sequential:
    if kind == "minatar":
        return nn.Sequential(nn.Conv2d(in_channels, 16, 3), nn.ReLU())
    if kind == "nature":
        return nn.Sequential(nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(),
                             nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU())
    if kind == "impala":
        return impala_stack(in_channels)
    layers: list[nn.Module] = []
    for out in conv_channels:  # conv3x3
        layers += [nn.Conv2d(in_channels, out, 3, padding=1), nn.ReLU()]
        in_channels = out
    return nn.Sequential(*layers)


def image_torso(kind: str, space: spaces.Box, model) -> ConvTorso:
    c = ImageInput(space, model.channels).chw[0]
    features = model.features or STANDARD_FEATURES.get(kind)
    # oneDNN's convolutions over large frames run faster channels last in memory on CPU (bench/RESULTS.md,
    # hot paths: an Ape-X update 1.17x with the Nature CNN, 1.6x with the IMPALA ResNet); over DHC's small
    # views they run slower.
    return ConvTorso(space, conv_stack(kind, c, list(model.conv_channels)), features, model.channels,
                     nhwc=kind in NHWC_TORSOS)


def is_image(space) -> bool:
    return isinstance(space, spaces.Box) and len(space.shape) == 3


def resolve_kind(space, model, auto_image: str = "auto") -> str:
    """The built-in torso `model.torso` names for this space ('auto' resolved)."""
    kind = model.torso
    if kind != "auto":
        return kind
    if not is_image(space):
        return "mlp"
    if auto_image != "auto":
        return auto_image
    _, h, w = ImageInput(space, model.channels).chw
    if max(h, w) <= 32:
        return "minatar"
    return "nature" if min(h, w) >= 36 else "impala"  # the ResNet's padded convs take any size


def torso_problem(space, kind: str) -> str | None:
    """Why built-in torso `kind` cannot take `space`, or None."""
    if not isinstance(space, spaces.Box):
        return f"{kind} needs a Box observation space, the env has {space}"
    if kind in IMAGE_TORSOS and not is_image(space):
        return f"{kind} needs an image observation (3 axes), the env's is shaped {space.shape}"
    if kind == "nature" and min(sorted(space.shape)[1:]) < 36:
        return f"nature needs images of at least 36x36 pixels, the env's are shaped {space.shape}"
    return None


def build_torso(space, model, auto_image: str = "auto") -> nn.Module:
    """A built-in torso for `space` (see the module docstring); ValueError naming what does not fit."""
    kind = resolve_kind(space, model, auto_image)
    problem = torso_problem(space, kind)
    if problem:
        raise ValueError(problem)
    if kind == "mlp":
        return MLPTorso(space, list(model.hidden), model.activation)
    return image_torso(kind, space, model)


def fan_in_uniform_(tensor: torch.Tensor, fan_in: int) -> torch.Tensor:
    """nn.Linear's default init, for parameters made by hand."""
    bound = 1.0 / math.sqrt(fan_in)
    with torch.no_grad():
        return tensor.uniform_(-bound, bound)
