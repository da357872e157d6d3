"""A policy's acting network out of distrl: an ONNX file (or TorchScript) that maps a batch of observations,
as the env gives them (uint8 frames stay uint8; a structured observation as one input per leaf, its
action mask among them), to the greedy action and the network's acting outputs.

The file holds the run's observation normalization (env.normalize.obs: its statistics, frozen), the
policy's own `nn.Module` (the one the learner trains) and, for the action, the greedy
branch of its acting rule (`distrl.sampling`) written in torch: argmax for Q-values and logits, the Box
mapping of a Gaussian's mean (tanh'd for SAC's). Outputs: `action`, then the policy's `acting_outputs()`
("q"; "out", "value", "log_std"; "mean", "log_std"), batch axis first and dynamic. ONNX is written by
torch's TorchScript-based exporter (`dynamo=False`, which needs the `onnx` package: `pip install
distrl[onnx]`): ~0.1 s for an MLP against ~2.5 s for the dynamo exporter (which also needs onnxscript),
which matters where a server exports every new version for clients that act locally.
"""
from __future__ import annotations

import io
import os
import tempfile
import warnings

import numpy as np
import torch
from torch import nn

from distrl import tree

OPSET = 17


class ExportError(ValueError):
    """This policy's acting cannot be written as one feedforward network."""


class ActingNetwork(nn.Module):
    """obs -> (greedy action, *acting outputs) of a network-backed policy."""

    def __init__(self, net: nn.Module, method: str, names: tuple[str, ...], rule, normalize=None, space=None):
        """`normalize`: (mean, 1 / std, clip or None) of the run's observation statistics (env.normalize.obs),
        applied to the raw observations the file is given, as the run's envs apply them. `space`: the
        observation space; a structured one's leaves are the file's inputs, one per leaf, named by their
        keys (`image`, `action_mask`, `pos.0`)."""
        super().__init__()
        self.net, self.method, self.names, self.kind = net, method, tuple(names), rule.kind
        self.structure = tree.sample(space, 1) if space is not None and tree.is_structured(space) else None
        self.input_names = ["obs"] if self.structure is None else [n for n, _ in tree.named_leaves(self.structure)]
        self.normalizes = normalize is not None
        if normalize is not None:  # in float64, as distrl.envs.normalize computes it
            mean, scale, self.clip = normalize
            self.register_buffer("obs_mean", torch.as_tensor(np.asarray(mean, np.float64)))
            self.register_buffer("obs_scale", torch.as_tensor(np.asarray(scale, np.float64)))
        factors = getattr(rule, "factors", None)
        if factors is not None:  # a MultiDiscrete or MultiBinary action: each factor's argmax
            self.register_buffer("factor_index", torch.as_tensor(factors.index), persistent=False)
            self.register_buffer("factor_start", torch.as_tensor(factors.start), persistent=False)
            self.factor_shape, self.factor_dtype = tuple(factors.shape), _torch_dtype(factors.dtype)
        box = getattr(rule, "box", None)
        if box is not None:  # the Box mapping in float64, as BoxScaler computes it
            self.register_buffer("low", torch.as_tensor(box.low, dtype=torch.float64))
            self.register_buffer("high", torch.as_tensor(box.high, dtype=torch.float64))
            self.register_buffer("half_range", torch.as_tensor(box.half, dtype=torch.float64))
            self.box_shape, self.box_dtype = tuple(box.shape), _torch_dtype(box.dtype)

    def forward(self, *inputs: torch.Tensor):
        obs = inputs[0] if self.structure is None else tree.unflatten_like(self.structure, list(inputs))
        if self.normalizes:
            obs = (obs.double() - self.obs_mean) * self.obs_scale
            if self.clip is not None:
                obs = obs.clamp(-self.clip, self.clip)
            obs = obs.float()
        out = getattr(self.net, self.method)(obs)
        values = [out[n] for n in self.names] if isinstance(out, dict) else \
            list(out) if isinstance(out, (tuple, list)) else [out]
        named = dict(zip(self.names, values))
        return (self.greedy(named), *values)

    def greedy(self, named: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.kind == "epsilon_greedy":
            return named["q"].argmax(dim=-1)
        if self.kind == "categorical":
            return named["out"].argmax(dim=-1)
        if self.kind == "factored_categorical":  # the logits laid out per factor, padded as distrl.sampling does
            out = named["out"]
            padded = torch.cat([out, torch.full_like(out[:, :1], float("-inf"))], 1)[:, self.factor_index]
            choice = padded.argmax(-1) + self.factor_start
            return choice.to(self.factor_dtype).reshape(out.shape[0], *self.factor_shape)
        a = torch.tanh(named["mean"]) if self.kind == "squashed_gaussian" else named["out"]
        env_a = torch.minimum(torch.maximum(self.low + (a.double() + 1.0) * self.half_range, self.low), self.high)
        return env_a.to(self.box_dtype).reshape(a.shape[0], *self.box_shape)


def _torch_dtype(dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, np.dtype(dtype))).dtype


def acting_network(policy, normalize=None) -> ActingNetwork:
    """The policy's acting network (its weights as loaded), taking raw observations (`normalize`: see
    `ActingNetwork`); ExportError for a policy that needs more than one feedforward pass per observation
    (a recurrent state)."""
    rule = policy.acting_rule()
    if rule is None or not hasattr(policy, "net"):
        raise ExportError(f"{type(policy).__name__} acts with a recurrent state: only feedforward policies "
                          "export (their actions depend on the observation alone)")
    return ActingNetwork(policy.net, policy.acting_method, policy.acting_outputs(), rule, normalize,
                         policy.spec.observation_space).eval()


def example_batch(space) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """One observation of `space`, as a batch of one: a tensor, or one per leaf of a structured observation
    (in the tree's order; an action mask all legal)."""
    if tree.is_structured(space):
        return tuple(torch.as_tensor(np.ones_like(x) if n == tree.MASK_KEY else np.zeros_like(x))
                     for n, x in tree.named_leaves(tree.sample(space, 1)))
    return torch.as_tensor(np.zeros((1, *space.shape), space.dtype))


def _inputs(example) -> tuple[torch.Tensor, ...]:
    return example if isinstance(example, tuple) else (example,)


def onnx_bytes(module: ActingNetwork, example) -> bytes:
    buf = io.BytesIO()
    axes = {name: {0: "batch"} for name in (*module.input_names, "action", *module.names)}
    with warnings.catch_warnings():  # the exporter's notes on the TorchScript path and on tracing
        warnings.simplefilter("ignore")
        torch.onnx.export(module, _inputs(example), buf, dynamo=False, input_names=module.input_names,
                          output_names=["action", *module.names], dynamic_axes=axes, opset_version=OPSET)
    return buf.getvalue()


def torchscript_bytes(module: ActingNetwork, example) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.trace(module, _inputs(example), check_trace=False), buf)
    return buf.getvalue()


def write_atomically(path: str, data: bytes) -> None:
    """`data` at `path`, complete or not at all (a temporary file beside it, renamed)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".export-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
