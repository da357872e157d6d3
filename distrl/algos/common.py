"""Small torch helpers shared by algorithm files (no ray, no env code)."""
from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from distrl.core import Weights


def mlp(sizes: list[int], activation=nn.ReLU, last_activation: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(activation())
    return nn.Sequential(*layers)


def to_numpy_weights(module: nn.Module) -> Weights:
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def load_numpy_weights(module: nn.Module, weights: Weights) -> None:
    module.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})


def adam(params, lr: float, device: str) -> torch.optim.Adam:
    # The fused kernel is ~30% faster per update on CPU for our small networks.
    return torch.optim.Adam(params, lr=lr, fused=device.startswith(("cpu", "cuda")))


def as_tensors(batch: dict[str, np.ndarray], device: str) -> dict[str, torch.Tensor]:
    """Zero-copy on CPU; ignores private keys (leading underscore)."""
    return {k: torch.as_tensor(v, device=device) for k, v in batch.items() if not k.startswith("_")}


# Arrays that arrive through Ray's object store are read-only views; we only ever
# read from the tensors made from them, so torch's warning about that is noise.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
