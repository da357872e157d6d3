"""Typed run configuration: YAML in, dataclasses out, one clear error per mistake.

Every field carries a one-line doc (``metadata["doc"]``) and, where it has one,
a valid range; `load_config` reports the first problem as a `ConfigError`
naming the dotted key, so the CLI can print one line and exit with status 2.
"""
from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

from distrl.registry import ALGOS

MODES = ("single", "sync", "async")


class ConfigError(ValueError):
    """A user mistake in a config file, an override or a flag."""


def f(default: Any, doc: str, *, lo: float | None = None, hi: float | None = None,
      choices: tuple | None = None, lo_open: bool = False) -> Any:
    """A dataclass field with its doc and the range `_check_range` enforces."""
    meta = {"doc": doc, "lo": lo, "hi": hi, "choices": choices, "lo_open": lo_open}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class EnvConfig:
    id: str = f("CartPole-v1", "gymnasium environment id")
    num_envs: int = f(16, "environments each rollout worker steps with one batched forward pass", lo=1)
    kwargs: dict = f({}, "keyword arguments passed to gymnasium.make (e.g. continuous: true)")


@dataclass
class RolloutConfig:
    fragment_length: int = f(16, "steps per environment in one fragment sent by a worker", lo=1)


@dataclass
class ReplayConfig:
    capacity: int = f(100_000, "transitions (steps, for sequence replay) kept; the oldest are dropped", lo=1)
    prioritized: bool = f(True, "proportional prioritized replay; false = uniform")
    alpha: float = f(0.6, "priority exponent (0 = uniform)", lo=0.0, hi=1.0)
    beta0: float = f(0.4, "initial importance-sampling exponent, annealed to 1", lo=0.0, hi=1.0)
    beta_steps: int = f(20_000, "sampled batches over which beta reaches 1", lo=1)
    learning_starts: int = f(1000, "transitions stored before the first update", lo=1)


@dataclass
class SequenceConfig:
    """How recurrent algorithms cut each env's episode into overlapping stored sequences.

    Sequence k of an episode covers episode steps [k*period - burn_in, k*period - burn_in + burn_in +
    length + n_step): the burn-in prefix comes first (padded before the episode start), then the
    trained steps, then n_step steps that only supply bootstrap targets.
    """

    burn_in: int = f(8, "steps unrolled without gradient from the stored state before the trained ones", lo=0)
    length: int = f(16, "trained steps per sequence", lo=1)
    period: int = f(8, "steps between the starts of consecutive sequences (length / 2 = 50% overlap)", lo=1)
    chunk_length: int = f(8, "steps per stored chunk: overlapping sequences share their chunks", lo=1)


@dataclass
class QueueConfig:
    capacity: int = f(8, "fragments the trajectory FIFO holds before workers are held back", lo=1)


@dataclass
class LearnerConfig:
    batch_size: int = f(256, "transitions per gradient update", lo=1)
    updates_per_step: float = f(0.0625, "gradient updates per env step (update-to-data ratio), held in every mode", lo=0.0, lo_open=True)
    batches_per_call: int = f(8, "batches fetched from the replay server per round trip", lo=1)
    publish_interval: int = f(8, "updates between weight publications to the parameter server", lo=1)
    fragments_per_update: int = f(0, "on-policy: fragments per update (0 = one per worker)", lo=0)


@dataclass
class EvalConfig:
    target_return: float | None = f(None, "mean greedy return that ends the run as solved (null = never)")
    episodes: int = f(20, "greedy episodes per evaluation", lo=1)
    interval_s: float = f(1.0, "seconds between evaluations", lo=0.0)
    interval_steps: int | None = f(None, "evaluate every this many env steps instead, waiting for the result (deterministic runs)", lo=1)


@dataclass
class StopConfig:
    max_seconds: float = f(600.0, "wall seconds before the run stops", lo=0.0, lo_open=True)
    max_env_steps: int | None = f(None, "env steps before the run stops (null = no limit)", lo=1)


@dataclass
class AsyncConfig:
    window_s: float = f(0.02, "seconds each async gather waits for ready workers", lo=0.0)


@dataclass
class FaultConfig:
    max_worker_restarts: int = f(10, "rollout-worker process restarts before the run stops", lo=0)
    max_env_errors: int = f(1000, "env exceptions (each ends its episode and is counted) before the run stops", lo=0)


@dataclass
class CheckpointConfig:
    interval_s: float = f(60.0, "seconds between whole-run checkpoints (one is also taken at every stop and on SIGTERM/SIGINT)", lo=0.0, lo_open=True)
    keep: int = f(3, "newest complete checkpoints kept", lo=1)
    max_replay_bytes: int = f(2_000_000_000, "replay larger than this is left out of checkpoints; a resumed run then refills it from the workers", lo=0)


@dataclass
class LogConfig:
    interval_s: float = f(1.0, "seconds between metrics.csv rows and progress updates", lo=0.01)
    interval_steps: int | None = f(None, "write a row every this many env steps instead (deterministic runs)", lo=1)
    progress: bool = f(True, "print a console progress line while training")
    tensorboard: bool = f(True, "write TensorBoard event files into the run dir")
    trace: bool = f(False, "record what every process does into RUN_DIR/trace.json (distrl timeline / report)")
    trace_events: int = f(200_000, "events each process keeps for the trace (a ring: the newest are kept)", lo=1)


@dataclass
class ApexDQNConfig:
    hidden: list = f([64, 64], "hidden layer sizes of the Q-network torso")
    dueling: bool = f(True, "dueling value/advantage head")
    double: bool = f(True, "double-DQN target (online argmax, target value)")
    n_step: int = f(3, "steps in the n-step return", lo=1)
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    lr: float = f(2e-3, "Adam learning rate", lo=0.0, lo_open=True)
    target_update_interval: int = f(100, "updates between target-network copies", lo=1)
    grad_clip: float | None = f(10.0, "max global gradient norm (null = no clipping)", lo=0.0, lo_open=True)
    eps: float = f(0.4, "Ape-X base epsilon: worker i uses eps^(1 + eps_alpha*i/(N-1))", lo=0.0, hi=1.0)
    eps_alpha: float = f(7.0, "Ape-X epsilon spread exponent", lo=0.0)
    eps_start: float = f(1.0, "single-worker epsilon at the start of its decay", lo=0.0, hi=1.0)
    eps_end: float = f(0.02, "single-worker epsilon after the decay", lo=0.0, hi=1.0)
    eps_decay_steps: int = f(5000, "worker env steps over which a single worker's epsilon decays", lo=1)


@dataclass
class SACConfig:
    hidden: list = f([256, 256], "hidden layer sizes of actor and critics")
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    n_step: int = f(1, "steps in the n-step critic target", lo=1)
    tau: float = f(0.005, "Polyak factor for the target critics", lo=0.0, hi=1.0, lo_open=True)
    actor_lr: float = f(3e-4, "actor Adam learning rate", lo=0.0, lo_open=True)
    critic_lr: float = f(3e-4, "critic Adam learning rate", lo=0.0, lo_open=True)
    alpha_lr: float = f(3e-4, "temperature Adam learning rate", lo=0.0, lo_open=True)
    init_alpha: float = f(1.0, "initial entropy temperature", lo=0.0, lo_open=True)
    autotune_alpha: bool = f(True, "learn the temperature towards target_entropy")
    target_entropy: float | None = f(None, "entropy target (null = -dim(action space))")
    random_steps: int = f(5000, "worker env steps with uniform random actions before the policy acts", lo=0)


@dataclass
class R2D2Config:
    hidden: list = f([64], "MLP torso layer sizes before the recurrent core")
    core: str = f("lstm", "recurrent core: lstm | gru", choices=("lstm", "gru"))
    core_size: int = f(64, "recurrent state size", lo=1)
    dueling: bool = f(True, "dueling value/advantage head")
    double: bool = f(True, "double-DQN target (online argmax, target value)")
    n_step: int = f(3, "steps in the n-step return", lo=1)
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    lr: float = f(1e-3, "Adam learning rate", lo=0.0, lo_open=True)
    target_update_interval: int = f(100, "updates between target-network copies", lo=1)
    grad_clip: float | None = f(10.0, "max global gradient norm (null = no clipping)", lo=0.0, lo_open=True)
    value_rescaling: bool = f(True, "targets through h(x) = sign(x)(sqrt(|x|+1) - 1) + eps x and its inverse")
    rescale_eps: float = f(1e-3, "the eps of the value rescaling h", lo=0.0)
    priority_eta: float = f(0.9, "sequence priority: eta * max|td| + (1 - eta) * mean|td|", lo=0.0, hi=1.0)
    eps: float = f(0.4, "Ape-X base epsilon: worker i uses eps^(1 + eps_alpha*i/(N-1))", lo=0.0, hi=1.0)
    eps_alpha: float = f(7.0, "Ape-X epsilon spread exponent", lo=0.0)
    eps_start: float = f(1.0, "single-worker epsilon at the start of its decay", lo=0.0, hi=1.0)
    eps_end: float = f(0.02, "single-worker epsilon after the decay", lo=0.0, hi=1.0)
    eps_decay_steps: int = f(5000, "worker env steps over which a single worker's epsilon decays", lo=1)


@dataclass
class ActorCriticConfig:
    """What A2C, A3C, PPO and IMPALA share; each has its own section with its own extra keys."""

    hidden: list = f([64, 64], "hidden layer sizes of the policy and value networks")
    shared_torso: bool = f(False, "policy and value heads share one torso")
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    lr: float = f(3e-4, "Adam learning rate", lo=0.0, lo_open=True)
    vf_coef: float = f(0.5, "value loss coefficient", lo=0.0)
    ent_coef: float = f(0.0, "entropy bonus coefficient", lo=0.0)
    grad_clip: float | None = f(0.5, "max global gradient norm (null = no clipping)", lo=0.0, lo_open=True)
    normalize_advantages: bool = f(True, "standardise advantages per update")


@dataclass
class A2CConfig(ActorCriticConfig):
    gae_lambda: float = f(0.95, "GAE lambda (1.0 = n-step returns)", lo=0.0, hi=1.0)


@dataclass
class A3CConfig(A2CConfig):
    max_staleness: int = f(16, "gradients computed more than this many updates ago are dropped", lo=0)


@dataclass
class PPOConfig(A2CConfig):
    clip: float = f(0.2, "surrogate ratio clip", lo=0.0, lo_open=True)
    vf_clip: float | None = f(None, "value clipping range (null = off)", lo=0.0, lo_open=True)
    epochs: int = f(4, "passes over each batch", lo=1)
    minibatches: int = f(4, "minibatches per epoch", lo=1)
    rho_bar: float = f(1.0, "async lag correction: V-trace importance weight clip", lo=0.0, lo_open=True)
    c_bar: float = f(1.0, "async lag correction: V-trace trace-cutting clip", lo=0.0, lo_open=True)


@dataclass
class ImpalaConfig(ActorCriticConfig):
    rho_bar: float = f(1.0, "V-trace importance weight clip for the value target and advantages", lo=0.0, lo_open=True)
    c_bar: float = f(1.0, "V-trace trace-cutting clip", lo=0.0, lo_open=True)


@dataclass
class Config:
    algo: str = f("apex_dqn", "algorithm name (see distrl.registry.ALGOS)")
    mode: str = f("async", "run mode: single | sync | async", choices=MODES)
    workers: int = f(2, "rollout workers (single mode uses one, in-process)", lo=1)
    seed: int = f(0, "base seed; worker i uses seed + i, the evaluator seed + 10_000", lo=0)
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
    apex_dqn: ApexDQNConfig = field(default_factory=ApexDQNConfig, metadata={"doc": "Ape-X DQN hyper-parameters"})
    sac: SACConfig = field(default_factory=SACConfig, metadata={"doc": "SAC hyper-parameters"})
    r2d2: R2D2Config = field(default_factory=R2D2Config, metadata={"doc": "R2D2 hyper-parameters"})
    a2c: A2CConfig = field(default_factory=A2CConfig, metadata={"doc": "A2C hyper-parameters"})
    a3c: A3CConfig = field(default_factory=A3CConfig, metadata={"doc": "A3C hyper-parameters"})
    ppo: PPOConfig = field(default_factory=PPOConfig, metadata={"doc": "PPO hyper-parameters"})
    impala: ImpalaConfig = field(default_factory=ImpalaConfig, metadata={"doc": "IMPALA hyper-parameters"})


def _key(fld: dataclasses.Field) -> str:
    return fld.metadata.get("key", fld.name)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "null")


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


def _build(cls: type, data: dict, prefix: str = "") -> Any:
    fields = {_key(fl): fl for fl in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for k in data:
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
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
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
