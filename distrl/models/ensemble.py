"""K copies of a torso with their own weights, run as one module: (B, ...) -> (K, B, out_features).

SAC's twin critics are two copies of one network. For the MLP torso the copies are stacked into
one batched matmul per layer (`StackedMLP`): half the kernel launches of two separate MLPs, which is
what a small update on a CPU pays for. Any other torso (an image one, a user's) runs copy by copy.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from distrl.models.factory import make_torso
from distrl.models.torsos import ACTIVATIONS, InputScale, fan_in_uniform_, resolve_kind


class StackedLinear(nn.Module):
    """K Linear layers of one shape applied at once: (K, B, in) -> (K, B, out); nn.Linear's init."""

    def __init__(self, copies: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(fan_in_uniform_(torch.empty(copies, in_features, out_features), in_features))
        self.bias = nn.Parameter(fan_in_uniform_(torch.empty(copies, 1, out_features), in_features))
        self.out_features = out_features

    def forward(self, x: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        w, b = (self.weight.detach(), self.bias.detach()) if detach_params else (self.weight, self.bias)
        return torch.baddbmm(b, x, w)


class StackedMLP(nn.Module):
    """K MLP torsos in stacked layers; the input (B, D) is shared by all copies."""

    def __init__(self, space, hidden: list[int], activation: str, copies: int):
        super().__init__()
        self.copies = copies
        self.scale = InputScale(space.dtype)
        sizes = [int(np.prod(space.shape)), *hidden]
        self.layers = nn.ModuleList(StackedLinear(copies, a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.activation = ACTIVATIONS[activation]()
        self.out_features = sizes[-1]

    def forward(self, obs: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        x = self.scale(obs).flatten(1).expand(self.copies, -1, -1)
        act = self.activation.forward  # the module's own forward: no hook dispatch per layer
        for layer in self.layers:
            x = act(layer.forward(x, detach_params))
        return x


class Copies(nn.Module):
    """K torsos of any kind, run one after the other and stacked."""

    def __init__(self, torsos: list[nn.Module]):
        super().__init__()
        self.torsos = nn.ModuleList(torsos)
        self.out_features = torsos[0].out_features

    def forward(self, obs: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        if not detach_params:
            return torch.stack([t(obs) for t in self.torsos])
        outs = []
        for t in self.torsos:  # gradients reach the input only: the parameters are read as constants
            params = {k: v.detach() for k, v in t.named_parameters()}
            outs.append(torch.func.functional_call(t, params, (obs,)))
        return torch.stack(outs)


def make_ensemble(space, model, copies: int) -> nn.Module:
    """`copies` torsos of what `model.torso` names, as one module giving (copies, B, out_features)."""
    if resolve_kind(space, model) == "mlp":
        return StackedMLP(space, list(model.hidden), model.activation, copies)
    return Copies([make_torso(space, model) for _ in range(copies)])
