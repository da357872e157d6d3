"""The torso of a structured observation (`distrl.tree`): one encoder per leaf, concatenated, then the MLP.

Per leaf, from its space: an image (a Box of rank 3) goes through an image torso (`model.encoders` names
it by the leaf's key, else chosen as for a plain image; `flat`: its entries, uint8 scaled to [0, 1];
`codes`: its entries as they are, for a small symbolic grid like MiniGrid's, whose object, colour and state
codes 0-10 would be scaled to 0-0.04); any other Box is flattened (uint8 scaled, bools
as 0/1); a Discrete is one-hot, a MultiDiscrete one-hot per factor, a MultiBinary its 0/1 entries. The
features of every leaf, in the tree's order, go through `model.hidden`'s layers. The `action_mask` leaf is
no input: the heads apply it (`distrl.models.masking`).

The first layer's product with a one-hot code is a lookup of the weight's columns the codes pick: the same
parameters and the same function as the product, without multiplying the zeros (Taxi's 500 states, 256
rows: 620 -> 170 us for the layer's forward and backward on one core).
"""
from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.nn import functional as F

from distrl import tree
from distrl.models.torsos import (ACTIVATIONS, IMAGE_TORSOS, InputScale, image_torso, is_image, mlp,
                                  resolve_kind, torso_problem)


class OneHot(nn.Module):
    """Integer leaves (a Discrete's (B,), a MultiDiscrete's (B, k)) -> their one-hot codes, concatenated."""

    def __init__(self, sizes: list[int], starts: list[int]):
        super().__init__()
        self.sizes = [int(n) for n in sizes]
        self.register_buffer("starts", torch.as_tensor(starts, dtype=torch.int64), persistent=False)
        offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])  # each factor's first column
        self.register_buffer("offsets", torch.as_tensor(offsets, dtype=torch.int64), persistent=False)
        self.out_features = int(sum(self.sizes))

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        """(B, k): each factor's code from 0."""
        return (x.reshape(x.shape[0], -1).long() - self.starts).clamp_(min=0)  # shape[0]: a traced batch axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes = self.codes(x)
        return torch.cat([F.one_hot(codes[:, i], n).float() for i, n in enumerate(self.sizes)], dim=1)

    def project(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`F.linear(self(x), weight)`, as the sum of the weight's columns the codes pick."""
        return weight.t()[self.codes(x) + self.offsets].sum(1)


class Flat(nn.Module):
    """A vector (or any Box that is no image, or a MultiBinary) leaf -> its entries as float features; `codes`:
    uint8 entries as they are, not scaled to [0, 1] (a symbolic grid's codes are no intensities)."""

    def __init__(self, space, codes: bool = False):
        super().__init__()
        self.scale = InputScale(np.float32 if codes else tree.leaf_dtype(space))
        self.out_features = int(np.prod(space.shape)) if space.shape else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(x).reshape(x.shape[0], -1)


def leaf_encoder(name: str, space, model, auto_image: str) -> nn.Module:
    """The encoder of one leaf; ValueError naming the leaf when its configured encoder does not fit."""
    if isinstance(space, spaces.Discrete):
        return OneHot([int(space.n)], [int(space.start)])
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec).reshape(-1)
        start = np.broadcast_to(np.asarray(getattr(space, "start", 0)), np.shape(space.nvec)).reshape(-1)
        return OneHot(nvec.tolist(), start.tolist())
    kind = model.encoders.get(name, "auto")
    if kind in ("flat", "codes") and isinstance(space, spaces.Box):
        return Flat(space, codes=kind == "codes")
    if is_image(space):
        kind = resolve_kind(space, _Auto(model), auto_image) if kind == "auto" else kind
        problem = torso_problem(space, kind) if kind in IMAGE_TORSOS else \
            f"an image leaf takes one of {', '.join(IMAGE_TORSOS)}, flat or codes, not {kind!r}"
        if problem:
            raise ValueError(f"model.encoders.{name}: {problem}")
        return image_torso(kind, space, model)
    if kind != "auto":
        raise ValueError(f"model.encoders.{name}: only image leaves take an encoder; {name!r} is {space}")
    return Flat(space)


class _Auto:
    """`model` read as if model.torso were auto (a leaf's image torso is chosen as a plain image's)."""

    def __init__(self, model):
        self.model = model
        self.torso = "auto"

    def __getattr__(self, name):
        return getattr(self.model, name)


class MultiInputTorso(nn.Module):
    """A structured observation -> (B, out_features): its leaves' encoders, concatenated, then the MLP."""

    def __init__(self, space, model, auto_image: str = "auto"):
        super().__init__()
        named = [(n, s) for n, s in tree.leaf_spaces(space) if n != tree.MASK_KEY]
        if not named:
            raise ValueError(f"the observation {space} has no leaf but the action mask")
        unknown = sorted(set(model.encoders) - {n for n, _ in named})
        if unknown:
            raise ValueError(f"model.encoders names {unknown[0]!r}, which the observation lacks "
                             f"(its leaves: {', '.join(n for n, _ in named)})")
        self.names = [n for n, _ in named]
        self.encoders = nn.ModuleList(leaf_encoder(n, s, model, auto_image) for n, s in named)
        width = sum(e.out_features for e in self.encoders)
        self.layers = mlp([width, *model.hidden], ACTIVATIONS[model.activation])
        self.out_features = int(model.hidden[-1]) if model.hidden else width
        ends = np.cumsum([e.out_features for e in self.encoders]).tolist()
        self.columns = list(zip([0, *ends[:-1]], ends))  # each leaf's columns of the first layer's weight
        self.lookup = bool(model.hidden) and any(isinstance(e, OneHot) for e in self.encoders)

    def forward(self, obs) -> torch.Tensor:
        leaves = [x for n, x in tree.named_leaves(obs) if n != tree.MASK_KEY]
        if not self.lookup:
            return self.layers(torch.cat([e(x) for e, x in zip(self.encoders, leaves)], dim=1))
        first = self.layers[0]
        h = first.bias
        for e, x, (lo, hi) in zip(self.encoders, leaves, self.columns):
            weight = first.weight[:, lo:hi]
            h = h + (e.project(x, weight) if isinstance(e, OneHot) else F.linear(e(x), weight))
        # The layers after the first (whose product is summed above), each by index: a slice would be a new
        # Sequential that is no submodule, which the numpy program's fx trace cannot follow.
        for i in range(1, len(self.layers)):
            h = self.layers[i](h)
        return h


class VectorLeaves(nn.Module):
    """A structured observation of vector leaves -> (B, width): each leaf's entries or one-hot codes (the
    encoders above that have no parameters), concatenated: the one flat input of a network built for a
    vector, such as SAC's critics. The action mask is no input."""

    def __init__(self, space, model):
        super().__init__()
        named = [(n, s) for n, s in tree.leaf_spaces(space) if n != tree.MASK_KEY]
        image = image_leaf(space)
        if image is not None:
            raise ValueError(f"leaf {image!r} is an image: these networks take vector leaves only")
        self.encoders = nn.ModuleList(leaf_encoder(n, s, model, "auto") for n, s in named)
        self.out_features = int(sum(e.out_features for e in self.encoders))

    def forward(self, obs) -> torch.Tensor:
        leaves = [x for n, x in tree.named_leaves(obs) if n != tree.MASK_KEY]
        return torch.cat([e(x) for e, x in zip(self.encoders, leaves)], dim=1)


def image_leaf(space) -> str | None:
    """The name of a structured observation's first image leaf, or None."""
    return next((n for n, s in tree.leaf_spaces(space) if is_image(s)), None)
