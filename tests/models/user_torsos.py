"""Users' torso factories for tests/models/test_factory.py: one that works and one per way of failing.

Each is named in a config as `tests.models.user_torsos:<Name>` and called as Factory(space, model).
"""
import numpy as np
import torch
from torch import nn


class Factory(nn.Module):
    """A working torso: flatten, one Linear to `model.kwargs["width"]` (default 8), tanh."""

    def __init__(self, space, model):
        super().__init__()
        self.out_features = int(model.kwargs.get("width", 8))
        self.layer = nn.Linear(int(np.prod(space.shape)), self.out_features)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.layer(obs.flatten(1).float()))


def raises(space, model):
    raise ValueError("this factory\nrefuses every space")


def not_a_module(space, model):
    return lambda obs: obs


class FloatOutFeatures(Factory):
    def __init__(self, space, model):
        super().__init__(space, model)
        self.out_features = 8.0


class WrongShape(Factory):
    """Claims 8 features and returns 9."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(obs), self.out_features + 1)


NOT_CALLABLE = 3
