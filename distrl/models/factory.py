"""`make_torso`: a built-in torso, or the user's own from `model.torso: "package.module:Factory"`.

A user factory is called as `Factory(observation_space, model_cfg)` and must return an `nn.Module`
with an integer `out_features` whose forward maps a batch of observations (as stored: uint8 frames
stay uint8) to (B, out_features) float features. `check_torso` runs one on a sampled batch, so a
factory that cannot be imported, raises or returns the wrong shape is refused before a run starts,
as a `TorsoError` naming it.
"""
from __future__ import annotations

import importlib
import os
import site

import numpy as np
import torch
from torch import nn

from distrl import tree
from distrl.models.multi_input import MultiInputTorso
from distrl.models.torsos import build_torso


class TorsoError(ValueError):
    """`model.torso` names something that does not give a working torso for this observation space."""


def is_user_factory(name: str) -> bool:
    return ":" in name


def load_factory(name: str):
    """The callable `module:Factory` names; TorsoError when it cannot be imported or is not callable."""
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise TorsoError(f"config key 'model.torso': {name!r} must look like package.module:Factory")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever the user's module raises on import
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise TorsoError(f"config key 'model.torso': cannot import {name!r}: {reason}") from None
    if not callable(obj):
        raise TorsoError(f"config key 'model.torso': {name!r} is not callable")
    return obj


def user_code(name: str):
    """The top-level module or package holding the factory `model.torso` names, when it is the user's own
    code rather than something installed (a cluster's nodes then need it shipped); else None."""
    if not is_user_factory(name):
        return None
    top = importlib.import_module(name.partition(":")[0].split(".")[0])
    path = os.path.realpath(getattr(top, "__file__", None) or "")
    installed = [os.path.realpath(p) for p in (*site.getsitepackages(), site.getusersitepackages())]
    if not path or top.__name__ == "distrl" or any(path.startswith(p + os.sep) for p in installed):
        return None
    return top


def make_torso(space, model, auto_image: str = "auto") -> nn.Module:
    """The torso `model.torso` names, for observations of `space` (`auto_image`: the algorithm's choice
    for images when model.torso is auto)."""
    if not is_user_factory(model.torso):
        try:
            if tree.is_structured(space):
                return MultiInputTorso(space, model, auto_image)
            return build_torso(space, model, auto_image)
        except ValueError as e:
            raise TorsoError(f"config key 'model.torso': {e}") from None
    factory = load_factory(model.torso)
    try:
        torso = factory(space, model)
    except Exception as e:  # noqa: BLE001 - the user's code: any failure is theirs, reported in one line
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise TorsoError(f"config key 'model.torso': {model.torso}({space}, model) raised {type(e).__name__}: "
                         f"{reason}") from None
    out = getattr(torso, "out_features", None)
    if not isinstance(torso, nn.Module) or isinstance(out, bool) or not isinstance(out, int) or out < 1:
        raise TorsoError(f"config key 'model.torso': {model.torso} must return an nn.Module with an int "
                         f"out_features >= 1, got {type(torso).__name__} with out_features={out!r}")
    return torso


def sample_batch(space, rows: int = 2):
    """`rows` observations drawn from `space`, in their stored dtypes, as tensors (a tree of them for a
    structured observation)."""
    if tree.is_structured(space):
        return tree.map(torch.as_tensor, tree.sample(space, rows))
    space.seed(0)
    return torch.as_tensor(np.stack([np.asarray(space.sample()) for _ in range(rows)]))


def _shown(obs) -> str:
    """A batch's shapes and dtypes, for a message."""
    if isinstance(obs, torch.Tensor):
        return f"shaped {tuple(obs.shape)} ({obs.dtype})"
    return "{" + ", ".join(f"{n}: {tuple(x.shape)} {x.dtype}" for n, x in tree.named_leaves(obs)) + "}"


def check_torso(torso: nn.Module, space, name: str) -> None:
    """TorsoError unless `torso` maps a batch of `space` to (B, out_features) finite floats."""
    obs = sample_batch(space)
    try:
        with torch.no_grad():
            out = torso(obs)
    except Exception as e:  # noqa: BLE001 - the user's forward
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise TorsoError(f"config key 'model.torso': {name} fails on a batch of observations {_shown(obs)}: "
                         f"{type(e).__name__}: {reason}") from None
    want = (tree.rows(obs), torso.out_features)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or not out.is_floating_point():
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        shapes = f"shaped {tuple(obs.shape)}" if isinstance(obs, torch.Tensor) else _shown(obs)
        raise TorsoError(f"config key 'model.torso': {name} must map observations {shapes} to "
                         f"float features shaped {want} (out_features), got {got}")
