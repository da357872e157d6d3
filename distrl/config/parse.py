"""Reading a config: YAML text and `section.key=value` overrides into checked dataclasses.

Every field carries a one-line doc (``metadata["doc"]``) and, where it has one, a valid range;
`build` reports the first problem as a `ConfigError` naming the dotted key, so the CLI can print one
line and exit with status 2. A nested section given in part keeps the defaults of the rest, which may
be an algorithm's own (see `distrl.config`).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from typing import Any

import yaml

from distrl.config.fields import ConfigError


def _key(fld: dataclasses.Field) -> str:
    return fld.metadata.get("key", fld.name)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "null")


FLOAT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against annotation `tp`; ints are accepted where floats are."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(value, inner[0], path)
    if tp is float and isinstance(value, str) and FLOAT_TEXT.match(value):
        value = float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string; a user means the number
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        list: isinstance(value, list),
        dict: isinstance(value, dict),
    }.get(tp, True)
    if not ok:
        raise ConfigError(f"config key '{path}': expected {_type_name(tp)}, got {value!r}")
    return float(value) if tp is float else value


def _check_range(fld: dataclasses.Field, value: Any, path: str) -> None:
    m = fld.metadata
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{path}': must be a finite number, got {value!r}")
    if isinstance(value, list) and m.get("item_lo") is not None:
        hi = m.get("hi") if m.get("hi") is not None else math.inf
        ints = all(isinstance(v, int) and not isinstance(v, bool) and m["item_lo"] <= v <= hi for v in value)
        if not ints or len(value) < m.get("min_items", 1):
            what = "a non-empty list" if m.get("min_items", 1) else "a list"
            most = f" and <= {m['hi']}" if m.get("hi") is not None else ""
            raise ConfigError(f"config key '{path}': must be {what} of integers >= {m['item_lo']}{most}, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and m.get("hi") is None and abs(value) > 2**62:
        raise ConfigError(f"config key '{path}': {value} is too large")
    if value is None or isinstance(value, (bool, str, list, dict)):
        if m.get("choices") and value not in m["choices"]:
            raise ConfigError(f"config key '{path}': must be one of {', '.join(m['choices'])}, got {value!r}")
        return
    lo, hi = m.get("lo"), m.get("hi")
    if lo is not None and (value < lo or (m.get("lo_open") and value == lo)):
        bound = f"> {lo}" if m.get("lo_open") else f">= {lo}"
        raise ConfigError(f"config key '{path}': must be {bound}, got {value!r}")
    if hi is not None and value > hi:
        raise ConfigError(f"config key '{path}': must be <= {hi}, got {value!r}")


# Keys that were replaced: naming the new one beats "unknown key" for a config written for an older distrl.
REPLACED = {
    "learner.updates_per_step": "replay.samples_per_insert (= updates_per_step x learner.batch_size)",
    "replay.learning_starts": "replay.min_size",
    # The network's keys moved from the algorithm sections to `model`.
    **{f"{algo}.hidden": "model.hidden" for algo in ("apex_dqn", "sac", "r2d2", "a2c", "a3c", "ppo", "impala")},
    "r2d2.core": "model.core", "r2d2.core_size": "model.core_size", "dhc.core_size": "model.core_size",
    "dhc.encoder": "model.conv_channels (or model.hidden for flat observations)",
}


def build(cls: type, data: dict, prefix: str = "", defaults: Any = None,
          unknown: typing.Callable[[str], str] | None = None) -> Any:
    """An instance of dataclass `cls` from `data`: `defaults` (an instance; else cls()) with the keys given
    replaced, each checked. A nested section given in part keeps its defaults for the rest.
    `unknown(key)` may explain a key the class does not have (e.g. another algorithm's section; a nested
    section's keys reach it with their section's prefix, `model.core`)."""
    fields = {_key(fl): fl for fl in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for k in data:
        if not isinstance(k, str):  # YAML reads `1: 2` as an int key
            raise ConfigError(f"config key '{prefix}{k}': a key must be a name, got {k!r}")
        if prefix + k in REPLACED:
            raise ConfigError(f"config key '{prefix}{k}' was replaced by {REPLACED[prefix + k]}")
        if k not in fields:
            why = unknown(k) if unknown else None
            raise ConfigError(why or f"unknown config key '{prefix}{k}' (known: {', '.join(fields)})")
    defaults = cls() if defaults is None else defaults
    kwargs = {}
    for k, fl in fields.items():
        if k not in data:
            continue
        if dataclasses.is_dataclass(hints[fl.name]):
            if not isinstance(data[k], dict):
                raise ConfigError(f"config key '{prefix}{k}': expected a mapping, got {data[k]!r}")
            inner = (lambda key, at=prefix + k + ".": unknown(at + key)) if unknown else None
            kwargs[fl.name] = build(hints[fl.name], data[k], prefix + k + ".", getattr(defaults, fl.name), inner)
            continue
        value = _convert(data[k], hints[fl.name], prefix + k)
        _check_range(fl, value, prefix + k)
        kwargs[fl.name] = value
    return dataclasses.replace(defaults, **kwargs)


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override '{item}' must look like section.key=value")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    except RecursionError:
        raise ConfigError(f"override '{key}': the value is nested too deeply") from None
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set `section.key=value` items (values parsed as YAML) into a raw config dict."""
    for item in overrides:
        parts, value = _parse_override(item)
        node = data
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override '{item}': '{p}' is not a section")
            node = child
        node[parts[-1]] = value
    return data


def read_yaml(path: str) -> dict:
    if os.path.isdir(path):
        raise ConfigError(f"config file {path} is a directory")
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not a text (YAML) file") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply") from None
    except OSError as e:  # unreadable (permissions), or gone since the check
        raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}") from None
    if data is None:  # empty, or only comments: training the defaults without a word would hide a wrong file
        raise ConfigError(f"config file {path} is empty: it names nothing to train (configs/ has one per algorithm "
                          f"and env)")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections")
    return data




def to_dict(cfg: Any) -> dict:
    """Plain nested dict using the YAML key names (e.g. 'async')."""
    out = {}
    for fl in dataclasses.fields(cfg):
        v = getattr(cfg, fl.name)
        out[_key(fl)] = to_dict(v) if dataclasses.is_dataclass(v) else v
    return out


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def describe(cfg: Any, prefix: str = "") -> list[str]:
    """One line per key of a config (a class: its defaults; an instance: its values), with its doc."""
    lines = []
    for fl in dataclasses.fields(cfg):
        name = prefix + _key(fl)
        if isinstance(cfg, type):
            value = fl.default_factory() if fl.default_factory is not dataclasses.MISSING else fl.default
        else:
            value = getattr(cfg, fl.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"{name}:  # {fl.metadata.get('doc', '')}")
            lines.extend(describe(value, name + "."))
        else:
            lines.append(f"{name} = {value!r}  # {fl.metadata.get('doc', '')}")
    return lines
