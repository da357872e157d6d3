"""Weights between processes, and a network run for acting.

Weights travel as a module's state_dict in numpy arrays: one object per publication, cheap to pickle
and zero-copy in Ray's object store. Every process builds the same `nn.Module` from the same code and
loads them; acting runs it under `torch.inference_mode()` (one compute thread per process,
`distrl.threads`).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

Weights = dict[str, np.ndarray]


def to_numpy_weights(module: nn.Module) -> Weights:
    """The module's state_dict as numpy arrays it does not alias."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def load_numpy_weights(module: nn.Module, weights: Weights) -> None:
    """Load a state_dict given as numpy arrays (strict: a renamed or missing parameter is an error)."""
    module.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()})


def laid_out_as(param: torch.Tensor, values) -> torch.Tensor:
    """`values` (an array or tensor of param's elements, any layout or shape; a gradient, Adam's moments)
    as a tensor laid out in memory as `param` is: the fused Adam walks a parameter, its gradient and its
    moments element by element in memory, so one in another layout (row-major for an input-major weight)
    would be applied to the wrong elements."""
    t = torch.as_tensor(values, device=param.device)
    return torch.empty_like(param, dtype=t.dtype).copy_(t.reshape(param.shape))


def as_input(x) -> torch.Tensor:
    """A numpy batch as a tensor without a copy."""
    return torch.as_tensor(np.asarray(x))


def numpy_out(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


# Arrays that arrive through Ray's object store are read-only views; we only ever read from the
# tensors made from them, so torch's warning about that is noise.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
