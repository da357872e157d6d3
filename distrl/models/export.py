"""A policy's acting network out of distrl: an ONNX file (or TorchScript) that maps a batch of observations,
as the env gives them (uint8 frames stay uint8; a structured observation as one input per leaf, its
action mask among them), to the greedy action and the network's acting outputs.

The file holds the run's observation normalization (env.normalize.obs: its statistics, frozen), the
policy's own `nn.Module` (the one the learner trains) and, for the action, the greedy
branch of its acting rule (`distrl.sampling`) written in torch: argmax for Q-values and logits, the Box
mapping of a Gaussian's mean (tanh'd for SAC's). Outputs: `action`, then the policy's `acting_outputs()`
("q"; "out", "value", "log_std"; "mean", "log_std"), batch axis first and dynamic. The inputs are those of
the policy's `acting_space`: the env's observation, or for MAPPO one agent's row of its actor, `agent` (its
index, int64), `own` (its observation, one input per leaf of a structured one) and its `action_mask` where
the env masks, each agent one row of the batch (the central critic's inputs
are training-time only: the file has no value output). ONNX is written by
torch's TorchScript-based exporter (`dynamo=False`, which needs the `onnx` package: `pip install
distrl[onnx]`): ~0.1 s for an MLP against ~2.5 s for the dynamo exporter (which also needs onnxscript),
which matters where a server exports every new version for clients that act locally.

A recurrent policy (the on-policy family with a `model.core`, and R2D2) exports one step of its network: the file
takes the state as one more input, `state`, float32 (batch, S, C) (S = 2 for an LSTM's h and c, 1 for a
GRU's h; C = model.core_size), after the observation input(s), and returns the state after the step as one
more output, `state_out`, after the others. The caller keeps one state per env: zeros at each episode's
start, then each step's `state_out` fed back as the next step's `state` (zeros again once the episode
ends), which is how distrl's own policy acts. A TorchScript file is called the same way: `(obs..., state)`.
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
from distrl.models.numpy_run import TRACING

OPSET = 17


class ExportError(ValueError):
    """This policy's acting cannot be written as one network step."""


class ActingNetwork(nn.Module):
    """obs -> (greedy action, *acting outputs) of a network-backed policy; a recurrent one's
    (obs, state) -> (greedy action, *acting outputs, next state)."""

    def __init__(self, net: nn.Module, method: str, names: tuple[str, ...], rule, normalize=None, space=None,
                 state_shape: tuple[int, ...] | None = None):
        """`names`: what `net.<method>` returns, in its order; `self.names` adds `state_out` for a recurrent
        net: every output after `action`, as the file names them. `normalize`: ({leaf: (mean, 1 / std)}, clip or None)
        of the run's observation statistics (env.normalize.obs; a flat observation is leaf ''), applied to
        the raw observations the file is given, as the run's envs apply them. `space`: the observation space; a structured one's leaves are
        the file's inputs, one per leaf, named by their keys (`image`, `action_mask`, `pos.0`).
        `state_shape`: one env's recurrent state, (S, C), for a net whose method is `(obs, state) ->
        (outputs, next state)`; None for a feedforward one."""
        super().__init__()
        self.net, self.method, self.outputs, self.kind = net, method, tuple(names), rule.kind
        self.state_shape = None if state_shape is None else tuple(state_shape)
        self.names = self.outputs + (() if self.state_shape is None else ("state_out",))
        self.structure = tree.sample(space, 1) if space is not None and tree.is_structured(space) else None
        self.input_names = ["obs"] if self.structure is None else [n for n, _ in tree.named_leaves(self.structure)]
        if self.state_shape is not None:
            self.input_names.append("state")
        self.normalized_inputs: list[int] = []  # the observation inputs normalized, by position
        if normalize is not None:  # in float64, as distrl.envs.normalize computes it
            stats, self.clip = normalize
            names = [""] if self.structure is None else [n for n, _ in tree.named_leaves(self.structure)]
            for i, name in enumerate(names):
                if name in stats:
                    self.register_buffer(f"obs_mean_{i}", torch.as_tensor(np.asarray(stats[name][0], np.float64)))
                    self.register_buffer(f"obs_scale_{i}", torch.as_tensor(np.asarray(stats[name][1], np.float64)))
                    self.normalized_inputs.append(i)
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
        leaves, state = (inputs, None) if self.state_shape is None else (inputs[:-1], inputs[-1])
        leaves = [self.normalized(i, x) if i in self.normalized_inputs else x for i, x in enumerate(leaves)]
        obs = leaves[0] if self.structure is None else tree.unflatten_like(self.structure, leaves)
        if state is None:
            out, after = getattr(self.net, self.method)(obs), ()
        else:
            out, next_state = getattr(self.net, self.method)(obs, state)
            after = (next_state,)
        values = [out[n] for n in self.outputs] if isinstance(out, dict) else \
            list(out) if isinstance(out, (tuple, list)) else [out]
        named = dict(zip(self.outputs, values))
        return (self.greedy(named), *values, *after)

    def normalized(self, i: int, obs: torch.Tensor) -> torch.Tensor:
        obs = (obs.double() - getattr(self, f"obs_mean_{i}")) * getattr(self, f"obs_scale_{i}")
        if self.clip is not None:
            obs = obs.clamp(-self.clip, self.clip)
        return obs.float()

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
    `ActingNetwork`), and a recurrent policy's state; ExportError for a policy whose actions it cannot
    write as one step of its network."""
    state_shape = getattr(policy, "state_shape", None)
    rule = _rule(policy, state_shape)
    if rule is None or not hasattr(policy, "net"):
        raise ExportError(f"{type(policy).__name__} acts with a recurrent state and names no rule for its "
                          "actions (sampling_rule()): it does not export")
    return ActingNetwork(policy.net, policy.acting_method, policy.acting_outputs(), rule, normalize,
                         policy.acting_space, state_shape).eval()


def _rule(policy, state_shape):
    """How `act` picks actions from `forward`'s outputs. A recurrent policy's `acting_rule()` is None (the
    external server, which runs no state, must refuse it), so such a policy names its rule with
    `sampling_rule()`: the file carries the state itself."""
    if state_shape is None:
        return policy.acting_rule()
    sampling = getattr(policy, "sampling_rule", None)
    return None if sampling is None else sampling()


def example_batch(space) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """One observation of `space`, as a batch of one: a tensor, or one per leaf of a structured observation
    (in the tree's order; an action mask all legal)."""
    if tree.is_structured(space):
        return tuple(torch.as_tensor(np.ones_like(x) if n == tree.MASK_KEY else np.zeros_like(x))
                     for n, x in tree.named_leaves(tree.sample(space, 1)))
    return torch.as_tensor(np.zeros((1, *space.shape), space.dtype))


def _inputs(module: ActingNetwork, example) -> tuple[torch.Tensor, ...]:
    """The traced call's inputs: `example`'s observation(s), then an episode start's state (zeros) for each
    of their rows where the module is recurrent (`example_batch` knows the space, not the policy)."""
    inputs = example if isinstance(example, tuple) else (example,)
    if module.state_shape is None:
        return inputs
    return (*inputs, torch.zeros((inputs[0].shape[0], *module.state_shape)))


def onnx_bytes(module: ActingNetwork, example) -> bytes:
    buf = io.BytesIO()
    axes = {name: {0: "batch"} for name in (*module.input_names, "action", *module.names)}
    with TRACING, warnings.catch_warnings():  # the exporter's notes on the TorchScript path, on tracing, on LSTM batches
        warnings.simplefilter("ignore")
        torch.onnx.export(module, _inputs(module, example), buf, dynamo=False, input_names=module.input_names,
                          output_names=["action", *module.names], dynamic_axes=axes, opset_version=OPSET)
    return buf.getvalue()


def torchscript_bytes(module: ActingNetwork, example) -> bytes:
    buf = io.BytesIO()
    with TRACING, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.trace(module, _inputs(module, example), check_trace=False), buf)
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
