"""Typed run configuration: YAML in, dataclasses out, one clear error per mistake.

A run's config holds the run sections every algorithm reads (`Config`), the sections of its data
path (replay, sequence, or the trajectory queue), a `model` section with the algorithm's defaults,
and the algorithm's own section under its name, and nothing else: another algorithm's section or a
section its data path does not use is refused, naming it. `config_class(algo)` builds that class
from what the algorithm declares (`distrl.core.Algorithm`).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field

from distrl.config.fields import MODES, ConfigError, f
from distrl.config.parse import apply_overrides, build, describe, dump_yaml, read_yaml, to_dict
from distrl.config.sections import (AsyncConfig, CheckpointConfig, DataConfig, EnvConfig, EvalConfig, ExternalConfig,
                                    FaultConfig, LearnerConfig, LogConfig, PlacementConfig, QueueConfig, ReplayConfig,
                                    RolloutConfig, SequenceConfig, StopConfig)
from distrl.registry import ALGORITHMS, algorithm

__all__ = ["MODES", "Config", "ConfigError", "apply_overrides", "config_class", "describe", "dump_yaml",
           "from_dict", "load_config", "read_yaml", "to_dict"]

DEFAULT_ALGO = "apex_dqn"


def section(cls: type, doc: str, key: str | None = None, default=None):
    meta = {"doc": doc, **({"key": key} if key else {})}
    return field(default_factory=default or cls, metadata=meta)


@dataclass
class Config:
    """The run sections; `config_class` adds the algorithm's."""

    algo: str = f(DEFAULT_ALGO, "algorithm name (see distrl.registry.ALGORITHMS)")
    mode: str = f("async", "run mode: single | sync | async", choices=MODES)
    workers: int = f(2, "rollout workers (single mode uses one, in-process)", lo=1)
    seed: int = f(0, "base seed; worker i uses seed + i, the evaluator seed + 10_000", lo=0, hi=2**31 - 1)
    device: str = f("auto", "learner and central inference server device: auto | cpu | cuda | cuda:N")
    env: EnvConfig = section(EnvConfig, "environment")
    external: ExternalConfig = section(ExternalConfig, "simulators that own their loop, through a server the run starts")
    rollout: RolloutConfig = section(RolloutConfig, "rollout workers")
    data: DataConfig = section(DataConfig, "offline training: where the experience comes from instead of workers")
    learner: LearnerConfig = section(LearnerConfig, "learner")
    eval: EvalConfig = section(EvalConfig, "evaluator")
    stop: StopConfig = section(StopConfig, "stop conditions")
    async_: AsyncConfig = section(AsyncConfig, "async mode", key="async")
    log: LogConfig = section(LogConfig, "logging")
    fault: FaultConfig = section(FaultConfig, "fault tolerance")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "whole-run checkpoints")
    placement: PlacementConfig = section(PlacementConfig, "where the Ray roles run (sync, async)")

    @property
    def algo_config(self):
        """This run's algorithm section."""
        return getattr(self, self.algo)

    def __reduce__(self):  # the class is made per algorithm: pickle by value
        return from_dict, (to_dict(self),)


# The sections a data path reads, with their docs.
DATA_SECTIONS = {
    "replay": (("replay", ReplayConfig, "replay server"),),
    "sequence": (("replay", ReplayConfig, "replay server"),
                 ("sequence", SequenceConfig, "stored sequences (recurrent algorithms)")),
    "trajectory": (("queue", QueueConfig, "trajectory FIFO (on-policy algorithms)"),),
    "gradients": (("queue", QueueConfig, "FIFO of worker-computed gradients"),),
}


@functools.cache
def config_class(name: str) -> type[Config]:
    """The config of an `algo: name` run: the run sections, its data path's, `model` and its own."""
    algo = algorithm(name)
    # Its own `algo` default: config_class(name)() is a config of `name`.
    extra = [("algo", str, f(name, "algorithm name (see distrl.registry.ALGORITHMS)"))]
    extra += [(key, cls, section(cls, doc)) for key, cls, doc in DATA_SECTIONS[algo.data_path]]

    def model():  # a fresh copy each time: the defaults hold lists, which two configs must not share
        return algo.model_config(**copy.deepcopy(algo.model_defaults))

    extra.append(("model", algo.model_config, section(algo.model_config, "the network's torso", default=model)))
    extra.append((name, algo.config, section(algo.config, f"{name} hyper-parameters")))
    cls = dataclasses.make_dataclass(f"{algo.__name__}RunConfig", extra, bases=(Config,))
    cls.__module__ = __name__
    return cls


def _not_a_section_of(name: str):
    """Explains a top-level key an `algo: name` run does not read."""
    def why(key: str) -> str | None:
        if key in ALGORITHMS:
            return (f"config key '{key}': a section of another algorithm; this config's algo is {name} "
                    f"(a config holds only its own algorithm's section)")
        if key in ("model.core", "model.core_size"):
            takers = [n for n in ALGORITHMS if "core" in {fl.name for fl in dataclasses.fields(algorithm(n).model_config)}]
            return f"config key '{key}': {name} has no recurrent core ({key} is for {', '.join(takers)})"
        users = [p for p, sections in DATA_SECTIONS.items() if key in (s[0] for s in sections)]
        if users:
            return (f"config key '{key}': {name} learns from {algorithm(name).data_path} data and reads no "
                    f"{key} section (it is for {' and '.join(users)} algorithms)")
        return None
    return why


def from_dict(data: dict) -> Config:
    name = data.get("algo", DEFAULT_ALGO) if isinstance(data, dict) else None
    if not isinstance(name, str) or name not in ALGORITHMS:
        raise ConfigError(f"config key 'algo': unknown algorithm {name!r} (known: {', '.join(ALGORITHMS)})")
    return build(config_class(name), data, unknown=_not_a_section_of(name))


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    data = read_yaml(path) if path else {}
    return from_dict(apply_overrides(data, overrides or []))
