"""Typed run configuration: YAML in, dataclasses out, one clear error per mistake.

Every field carries a one-line doc (``metadata["doc"]``) and, where it has one,
a valid range; `load_config` reports the first problem as a `ConfigError`
naming the dotted key, so the CLI can print one line and exit with status 2.
The sections are in `sections` (the run) and `algorithms` (one per algorithm).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

from distrl.config.algorithms import (A2CConfig, A3CConfig, ApexDQNConfig, DHCConfig, ImpalaConfig, PPOConfig,
                                      R2D2Config, SACConfig)
from distrl.config.fields import MODES, ConfigError, f
from distrl.config.sections import (AsyncConfig, CheckpointConfig, EnvConfig, EvalConfig, FaultConfig,
                                    LearnerConfig, LogConfig, PlacementConfig, QueueConfig, ReplayConfig,
                                    RolloutConfig, SequenceConfig, StopConfig)
from distrl.registry import ALGOS

__all__ = ["MODES", "Config", "ConfigError", "apply_overrides", "describe", "dump_yaml", "from_dict",
           "load_config", "read_yaml", "to_dict"]


@dataclass
class Config:
    algo: str = f("apex_dqn", "algorithm name (see distrl.registry.ALGOS)")
    mode: str = f("async", "run mode: single | sync | async", choices=MODES)
    workers: int = f(2, "rollout workers (single mode uses one, in-process)", lo=1)
    seed: int = f(0, "base seed; worker i uses seed + i, the evaluator seed + 10_000", lo=0, hi=2**31 - 1)
    device: str = f("auto", "learner device: auto | cpu | cuda | cuda:N")
    env: EnvConfig = field(default_factory=EnvConfig, metadata={"doc": "environment"})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"doc": "rollout workers"})
    replay: ReplayConfig = field(default_factory=ReplayConfig, metadata={"doc": "replay server"})
    learner: LearnerConfig = field(default_factory=LearnerConfig, metadata={"doc": "learner"})
    queue: QueueConfig = field(default_factory=QueueConfig, metadata={"doc": "trajectory FIFO (on-policy algorithms)"})
    sequence: SequenceConfig = field(default_factory=SequenceConfig, metadata={"doc": "stored sequences (recurrent algorithms)"})
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"doc": "evaluator"})
    stop: StopConfig = field(default_factory=StopConfig, metadata={"doc": "stop conditions"})
    async_: AsyncConfig = field(default_factory=AsyncConfig, metadata={"doc": "async mode", "key": "async"})
    log: LogConfig = field(default_factory=LogConfig, metadata={"doc": "logging"})
    fault: FaultConfig = field(default_factory=FaultConfig, metadata={"doc": "fault tolerance"})
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata={"doc": "whole-run checkpoints"})
    placement: PlacementConfig = field(default_factory=PlacementConfig, metadata={"doc": "where the Ray roles run (sync, async)"})
    apex_dqn: ApexDQNConfig = field(default_factory=ApexDQNConfig, metadata={"doc": "Ape-X DQN hyper-parameters"})
    sac: SACConfig = field(default_factory=SACConfig, metadata={"doc": "SAC hyper-parameters"})
    r2d2: R2D2Config = field(default_factory=R2D2Config, metadata={"doc": "R2D2 hyper-parameters"})
    dhc: DHCConfig = field(default_factory=DHCConfig, metadata={"doc": "DHC (multi-agent, communicating) hyper-parameters"})
    a2c: A2CConfig = field(default_factory=A2CConfig, metadata={"doc": "A2C hyper-parameters"})
    a3c: A3CConfig = field(default_factory=A3CConfig, metadata={"doc": "A3C hyper-parameters"})
    ppo: PPOConfig = field(default_factory=PPOConfig, metadata={"doc": "PPO hyper-parameters"})
    impala: ImpalaConfig = field(default_factory=ImpalaConfig, metadata={"doc": "IMPALA hyper-parameters"})


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
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{path}': expected a mapping, got {value!r}")
        return _build(tp, value, path + ".")
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
        ints = all(isinstance(v, int) and not isinstance(v, bool) and v >= m["item_lo"] for v in value)
        if not ints or len(value) < m.get("min_items", 1):
            what = "a non-empty list" if m.get("min_items", 1) else "a list"
            raise ConfigError(f"config key '{path}': must be {what} of integers >= {m['item_lo']}, got {value!r}")
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
}


def _build(cls: type, data: dict, prefix: str = "") -> Any:
    fields = {_key(fl): fl for fl in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for k in data:
        if not isinstance(k, str):  # YAML reads `1: 2` as an int key
            raise ConfigError(f"config key '{prefix}{k}': a key must be a name, got {k!r}")
        if prefix + k in REPLACED:
            raise ConfigError(f"config key '{prefix}{k}' was replaced by {REPLACED[prefix + k]}")
        if k not in fields:
            raise ConfigError(f"unknown config key '{prefix}{k}' (known: {', '.join(fields)})")
    kwargs = {}
    for k, fl in fields.items():
        if k not in data:
            continue
        value = _convert(data[k], hints[fl.name], prefix + k)
        _check_range(fl, value, prefix + k)
        kwargs[fl.name] = value
    return cls(**kwargs)


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
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections")
    return data


def from_dict(data: dict) -> Config:
    cfg = _build(Config, data)
    if cfg.algo not in ALGOS:
        raise ConfigError(f"config key 'algo': unknown algorithm {cfg.algo!r} (known: {', '.join(ALGOS)})")
    return cfg


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    data = read_yaml(path) if path else {}
    return from_dict(apply_overrides(data, overrides or []))


def to_dict(cfg: Any) -> dict:
    """Plain nested dict using the YAML key names (e.g. 'async')."""
    out = {}
    for fl in dataclasses.fields(cfg):
        v = getattr(cfg, fl.name)
        out[_key(fl)] = to_dict(v) if dataclasses.is_dataclass(v) else v
    return out


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def describe(cls: type = Config, prefix: str = "") -> list[str]:
    """One line per field: key, default and doc — for `distrl config --help`-style output."""
    lines = []
    for fl in dataclasses.fields(cls):
        name = prefix + _key(fl)
        default = fl.default_factory() if fl.default_factory is not dataclasses.MISSING else fl.default
        if dataclasses.is_dataclass(default):
            lines.extend(describe(type(default), name + "."))
        else:
            lines.append(f"{name} = {default!r}  # {fl.metadata.get('doc', '')}")
    return lines
