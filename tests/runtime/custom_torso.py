"""A user's own torso, as `model.torso: "tests.runtime.custom_torso:LayerNormTorso"` names it: a layer
no built-in torso has (LayerNorm), its width from `model.kwargs`."""
import numpy as np
import torch
from torch import nn


class LayerNormTorso(nn.Module):
    def __init__(self, observation_space, model_cfg):
        super().__init__()
        width = int(model_cfg.kwargs.get("width", 48))
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(observation_space.shape)), width),
                                  nn.LayerNorm(width), nn.ReLU())
        self.out_features = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(obs.float())


def raising(observation_space, model_cfg):
    raise RuntimeError("no GPU kernel for this layer")


class WrongWidth(LayerNormTorso):
    """Claims more features than its forward gives."""

    def __init__(self, observation_space, model_cfg):
        super().__init__(observation_space, model_cfg)
        self.out_features += 1


def not_a_module(observation_space, model_cfg):
    return lambda obs: obs
