"""A network's acting method run in numpy: the same module, traced once, without torch's per-op dispatch.

A worker's step runs a small network on a few rows. There each torch op pays 3-5 µs of dispatch
against ~1 µs for a numpy call, and the arithmetic is the smaller part of either: a 64x64 MLP acting
on 8 rows costs ~110 µs through torch and ~35 µs in numpy. `numpy_program(module, method, x)` traces
`module.<method>` with torch.fx into its ops; when every op is one listed here (linear layers,
elementwise activations, layer norm, reshapes, concatenation, arithmetic, one-hot codes, comparisons
and masking), it returns a function that runs those ops on numpy arrays with the module's own
parameters - numpy views of the same memory, so weights loaded into the module reach it without a
copy. Anything else (convolutions, recurrent cores, attention, control flow on values) gives None and
the caller runs torch.

The input is one array or a tree of them (a Dict or Tuple observation, `distrl.tree`): the method is
traced on the tree rebuilt from its leaves, so the network walks it as it walks tensors (picks the
action mask, encodes each leaf), and the program takes a tree of the same structure.

It is one program for every algorithm's network, never a second implementation of one: what it runs
is read from the module, and it is checked against torch on the first input it gets (a mismatch gives
None) and, in the tests, on every algorithm's network.
"""
from __future__ import annotations

import math
import operator
import threading
from typing import Any, Callable

import numpy as np
import optree
import torch
from torch import fx, nn
from torch.nn import functional as F

from distrl import tree
from distrl.models.weights import numpy_out

Program = Callable[[tree.Tree], Any]

_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
              torch.int32: np.int32, torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_}

# How far a program may be from torch: float32 rounding, numpy and torch summing matmuls in their own order
# (their BLAS kernels differ by CPU; ~1e-5 relative seen on Intel Xeon through SAC's log-std rescaling).
RTOL, ATOL = 1e-4, 1e-5


# `inplace` is ignored: numpy returns a new array, and a graph whose later ops read an in-place
# activation's input fails the check against torch.
def _relu(x, inplace=False):
    return np.maximum(x, 0.0, dtype=x.dtype)


def _elu(x, alpha=1.0, inplace=False):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0))).astype(x.dtype, copy=False)


def _sigmoid(x):
    return 0.5 + 0.5 * np.tanh(0.5 * x)  # no overflow warning where exp(-x) would overflow


def _silu(x, inplace=False):
    return x * _sigmoid(x)


def _linear(x, weight, bias=None):
    y = x @ weight.T
    return y + bias if bias is not None else y


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    axes = tuple(range(-len(normalized_shape), 0))
    mean = x.mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)  # the biased variance, as torch's
    y = y * weight if weight is not None else y
    return y + bias if bias is not None else y


def _flatten(x, start_dim=0, end_dim=-1):
    start, end = start_dim % x.ndim, end_dim % x.ndim
    # The flattened size spelled out, not -1: that is ambiguous for an array of zero rows.
    return x.reshape(*x.shape[:start], math.prod(x.shape[start:end + 1]), *x.shape[end + 1:])


def _squeeze(x, dim=None):
    if dim is None:
        return np.squeeze(x)
    return np.squeeze(x, dim) if x.shape[dim] == 1 else x


def _chunk(x, chunks, dim=0):
    size = -(-x.shape[dim] // chunks)  # torch's rule: ceil-sized pieces, the last may be smaller
    return tuple(np.split(x, range(size, x.shape[dim], size), axis=dim))


def _to(x, *args, **kwargs):
    dtype = kwargs.get("dtype", args[0] if args else None)
    if not isinstance(dtype, torch.dtype) or dtype not in _NP_DTYPES:
        raise _Unsupported(f"to({args}, {kwargs})")
    return x.astype(_NP_DTYPES[dtype], copy=False)


def _one_hot(x, num_classes=-1):
    if x.dtype != np.int64:
        raise TypeError("one_hot is only applicable to index tensor of type LongTensor")  # torch's rule
    if x.size and x.min() < 0:  # torch refuses them; numpy's indexing would wrap them
        raise ValueError("Class values must be non-negative.")
    n = int(x.max()) + 1 if num_classes < 0 and x.size else num_classes
    out = np.zeros((x.size, n), np.int64)
    out[np.arange(x.size), x.reshape(-1)] = 1  # a value past n raises, as torch does
    return out.reshape(*x.shape, n)


def _masked_fill(x, mask, value):
    return np.where(mask, np.asarray(value, x.dtype), x)


def _clamp(x, min=None, max=None):  # noqa: A002 - torch's keyword names
    if min is not None:
        x = np.maximum(x, np.asarray(min, x.dtype))
    return np.minimum(x, np.asarray(max, x.dtype)) if max is not None else x


def _cast(dtype):
    return lambda x: x.astype(dtype, copy=False)


def _cat(xs, dim=0):
    # One piece (a torso of one leaf, a one-hot of one factor) is itself: no op here writes in place, so the
    # copy torch makes would be the only difference.
    return xs[0] if len(xs) == 1 else np.concatenate(xs, axis=dim)


def _mean(x, dim=None, keepdim=False):
    return x.mean(axis=dim, keepdims=keepdim)


def _sum(x, dim=None, keepdim=False):
    return x.sum(axis=dim, keepdims=keepdim)


# Layers run as one numpy function of their input, given the layer.
_MODULES: dict[type, Callable[[nn.Module], Callable]] = {
    nn.Linear: lambda m: (lambda x, w=_view(m.weight), b=_view(m.bias): _linear(x, w, b)),
    nn.ReLU: lambda m: _relu,
    nn.Tanh: lambda m: np.tanh,
    nn.Sigmoid: lambda m: _sigmoid,
    nn.SiLU: lambda m: _silu,
    nn.ELU: lambda m: (lambda x, a=m.alpha: _elu(x, a)),
    nn.LayerNorm: lambda m: (lambda x, s=tuple(m.normalized_shape), w=_view(m.weight), b=_view(m.bias), e=m.eps:
                             _layer_norm(x, s, w, b, e)),
    nn.Identity: lambda m: (lambda x: x),
    nn.Flatten: lambda m: (lambda x, s=m.start_dim, e=m.end_dim: _flatten(x, s, e)),
}
_FUNCTIONS: dict[Any, Callable] = {
    F.linear: _linear, F.relu: _relu, torch.relu: _relu, torch.tanh: np.tanh, F.tanh: np.tanh,
    torch.sigmoid: _sigmoid, F.silu: _silu, F.elu: _elu, torch.exp: np.exp, torch.cat: _cat,
    F.layer_norm: _layer_norm, torch.flatten: _flatten, torch.squeeze: _squeeze, torch.chunk: _chunk,
    operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
    operator.truediv: operator.truediv, operator.neg: operator.neg, operator.getitem: operator.getitem,
    operator.eq: operator.eq, operator.ne: operator.ne, operator.lt: operator.lt, operator.le: operator.le,
    operator.gt: operator.gt, operator.ge: operator.ge, operator.invert: operator.invert,
    F.one_hot: _one_hot, torch.where: np.where, torch.clamp: _clamp, torch.logical_not: np.logical_not,
    getattr: getattr,  # the attributes in _ATTRIBUTES only (`_compile`)
}
# Attributes a traced method may read off an array: the same values in numpy (a dtype would not be).
_ATTRIBUTES = ("shape", "ndim")
_METHODS: dict[str, Callable] = {
    "to": _to, "float": _cast(np.float32), "long": _cast(np.int64), "bool": _cast(np.bool_), "flatten": _flatten,
    "squeeze": _squeeze, "unsqueeze": np.expand_dims, "chunk": _chunk, "exp": np.exp, "tanh": np.tanh,
    "expand_as": lambda x, other: np.broadcast_to(x, other.shape), "mean": _mean, "sum": _sum,
    "reshape": lambda x, *shape: x.reshape(*shape), "view": lambda x, *shape: x.reshape(*shape),
    "relu": _relu, "sigmoid": _sigmoid, "size": lambda x, dim=None: x.shape if dim is None else x.shape[dim],
    "masked_fill": _masked_fill, "clamp": _clamp, "clamp_min": _clamp,
    "logical_not": np.logical_not, "t": np.transpose,
    # In place on a value of the network's own making (a torso's float copy, a one-hot's codes): the value
    # is what counts here.
    "div_": operator.truediv, "clamp_": _clamp, "masked_fill_": _masked_fill,
}


class _Unsupported(Exception):
    pass


def _view(t: torch.Tensor | None) -> np.ndarray | None:
    """A numpy array sharing the tensor's memory (load_state_dict copies into it in place)."""
    return None if t is None else numpy_out(t)


# torch.fx replaces nn.Module.__call__ for the whole process while it traces: a module that another thread calls
# meanwhile (an ONNX export tracing its own copy of the network: the external server's weights thread) is taken
# for part of this trace, and fails as "not installed as a submodule". Whoever traces a network holds this.
TRACING = threading.Lock()


class _Tracer(fx.Tracer):
    """Keeps the layers it can run whole as single nodes; traces into every other module."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return type(m) in _MODULES


class _Method(nn.Module):
    """`net.<method>(x)` as a forward to trace. With a `structure` (a tree's, `optree.PyTreeSpec`), `x` is
    the list of its leaves and the method gets the tree they make: traced, each leaf is an item of the
    one input, and the tree holds them as the network expects."""

    def __init__(self, net: nn.Module, method: str, structure=None):
        super().__init__()
        self.net, self.method, self.structure = net, method, structure

    def forward(self, x):
        if self.structure is not None:
            x = optree.tree_unflatten(self.structure, [x[i] for i in range(self.structure.num_leaves)])
        return getattr(self.net, self.method)(x)


def _leaves_of(structure):
    """A tree of `structure` -> its leaves as arrays (what a structured program's input is read as)."""

    def leaves(x):
        values, got = optree.tree_flatten(x)
        if got != structure:
            raise ValueError(f"a numpy program of inputs shaped {structure} was given {got}")
        return [np.asarray(v) for v in values]

    return leaves


def _compile(graph: fx.Graph, root: _Method) -> Program:
    """The graph as the source of one Python function over numpy values, each op a bound global."""
    names: dict[fx.Node, str] = {}
    bound: dict[str, Any] = {}
    lines: list[str] = []

    def bind(value) -> str:
        name = f"_g{len(bound)}"
        bound[name] = value
        return name

    def render(a) -> str:
        if isinstance(a, fx.Node):
            return names[a]
        if isinstance(a, tuple):
            return "(" + "".join(render(x) + ", " for x in a) + ")"
        if isinstance(a, list):
            return "[" + ", ".join(render(x) for x in a) + "]"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{k!r}: {render(v)}" for k, v in a.items()) + "}"
        if isinstance(a, torch.Tensor):
            raise _Unsupported("a tensor constant")
        return bind(a)

    for node in graph.nodes:
        name = names[node] = f"v{len(names)}"
        if node.op == "placeholder":
            # A tree's program reads its leaves first: the one input the trace indexes.
            read = "x" if root.structure is None else f"{bind(_leaves_of(root.structure))}(x)"
            lines.append(f"{name} = {read}")
            continue
        if node.op == "output":
            lines.append(f"return {render(node.args[0])}")
            break
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(root)
            if not isinstance(value, torch.Tensor):
                raise _Unsupported(f"attribute {node.target}")
            lines.append(f"{name} = {bind(_view(value))}")
            continue
        if node.op == "call_module":
            layer = root.get_submodule(node.target)
            fn = _MODULES[type(layer)](layer)
        elif node.op == "call_function":
            fn = _FUNCTIONS.get(node.target)
            if node.target is getattr and node.args[1] not in _ATTRIBUTES:
                raise _Unsupported(f"attribute {node.args[1]!r} of a value")
        else:
            fn = _METHODS.get(node.target)
        if fn is None:
            raise _Unsupported(f"{node.op} {node.target}")
        args = [render(a) for a in node.args] + [f"{k}={render(v)}" for k, v in node.kwargs.items()]
        lines.append(f"{name} = {bind(fn)}({', '.join(args)})")
    source = "def program(x):\n" + "".join(f"    {line}\n" for line in lines)
    namespace = dict(bound)
    exec(compile(source, "<numpy program>", "exec"), namespace)  # noqa: S102 - source built above from the graph
    return namespace["program"]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        a = a.detach().numpy()
        return isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype and np.allclose(
            a, b, rtol=RTOL, atol=ATOL, equal_nan=True)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def numpy_program(net: nn.Module, method: str, x: tree.Tree) -> Program | None:
    """`net.<method>` as a numpy function of one input, or None where it needs an op not listed here.

    `x` is an input to check it on, one array or a tree of them (`distrl.tree`; the program then takes
    trees of its structure): the program is returned only if it gives torch's outputs on it.
    """
    try:
        if isinstance(x, np.ndarray):
            root, tensors = _Method(net, method), torch.as_tensor(x)
        else:
            leaves, structure = optree.tree_flatten(x)
            root, tensors = _Method(net, method, structure), [torch.as_tensor(np.asarray(v)) for v in leaves]
        with TRACING:
            graph = _Tracer().trace(root)
        program = _compile(graph, root)
        with torch.inference_mode():
            expected = root(tensors)
        return program if _same(expected, program(x)) else None
    except Exception:  # noqa: BLE001 - any op or control flow fx or this table can't take: run torch
        return None
