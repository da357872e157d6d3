"""The Python API: `train(config) -> summary`, `resume(run_dir)`, `evaluate(run_dir)`; usable from a notebook."""
from __future__ import annotations

import os
import re
import secrets
import time
from typing import Any

from distrl.config import Config, ConfigError, apply_overrides, from_dict, load_config, to_dict


# Rollout workers one machine hosts without a cluster: beyond a few per core they only contend,
# and each is a process with its own interpreter and envs.
WORKERS_PER_CORE, WORKER_MB = 8, 300


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container or `taskset` may allow fewer than
    the machine has)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def host_worker_limit() -> int:
    """Rollout workers this machine can host embedded: by the CPUs this process may use, and by free memory."""
    cores = usable_cpus()
    try:
        free_mb = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (ValueError, OSError):
        free_mb = WORKER_MB * WORKERS_PER_CORE * cores
    return max(1, min(WORKERS_PER_CORE * cores, free_mb // WORKER_MB))


def validate(cfg: Config, address: str | None = None, resuming: bool = False) -> None:
    """Everything about a config that can be checked before a run dir exists (`address`: a cluster to join;
    `resuming`: a run that wrote before, whose log.dataset may exist)."""
    from distrl.envs import EnvError, check_env
    from distrl.registry import algorithm

    algo = algorithm(cfg.algo)
    try:
        spec = _check_multiagent_env(cfg) if algo.multi_agent else check_env(
            cfg.env.id, cfg.env.kwargs, wrappers=cfg.env.wrappers, preset=cfg.env.preset)
    except EnvError as e:
        raise ConfigError(str(e)) from None
    problem = algo.check_spec(spec)
    if problem:
        raise ConfigError(f"config key 'algo': {problem} ({cfg.env.id})")
    _check_torsos(cfg, spec)
    _check_datasets(cfg, algo, spec, resuming)
    if cfg.mode not in algo.modes:
        raise ConfigError(f"config key 'mode': {cfg.algo} does not support mode {cfg.mode!r} "
                          f"(supported: {', '.join(algo.modes)})")
    if cfg.device != "auto" and not (cfg.device == "cpu" or cfg.device.startswith("cuda")):
        raise ConfigError(f"config key 'device': expected auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    _check_device(cfg.device)
    if algo.data_path in ("replay", "sequence"):
        _check_replay(cfg, spec, on_this_machine=not address)
    limit = host_worker_limit()
    if not address and cfg.mode != "single" and cfg.workers > limit:
        raise ConfigError(f"config key 'workers': {cfg.workers} workers cannot run on this machine without a "
                          f"cluster; it can host {limit} ({WORKERS_PER_CORE} per core, within free memory). "
                          "Use fewer, or --address to join a Ray cluster")
    _check_ray_only(cfg)
    from distrl.roles.filming import check_outputs  # issue 28: log.wandb / log.mlflow installed, videos renderable

    check_outputs(cfg)
    if cfg.mode != "single":  # single mode starts no Ray: placement does not apply
        _check_placement_amounts(cfg)
        from distrl.runtime.ray_setup import check_placement

        check_placement(cfg, address)  # last: it joins (or starts) the Ray the run will use


def _check_replay(cfg: Config, spec, on_this_machine: bool, memory: int | None = None) -> None:
    """A batch the replay can hold, a rate limiter that cannot stall, a capacity the machine (`memory` bytes,
    by default its physical memory) can hold."""
    from distrl.registry import algorithm
    from distrl.replay.rate_limiter import RateLimiter
    from distrl.replay.sizing import flat_item_bytes, sequence_step_bytes
    from distrl.runtime.pacing import error_buffer

    r, batch = cfg.replay, cfg.learner.batch_size
    if r.min_size > r.capacity:
        raise ConfigError("config key 'replay.min_size': larger than replay.capacity, learning would never start")
    if batch > r.capacity:
        raise ConfigError(f"config key 'learner.batch_size': {batch} is larger than replay.capacity ({r.capacity})")
    if not RateLimiter.deadlock_free(r.samples_per_insert, error_buffer(cfg), batch):
        least = RateLimiter.smallest_error_buffer(r.samples_per_insert, batch)
        raise ConfigError(f"config key 'replay.error_buffer': {r.error_buffer:g} is too small: with "
                          f"replay.samples_per_insert={r.samples_per_insert:g} and learner.batch_size={batch} the "
                          f"learner and the workers can both block for ever; the smallest that works is {least:g}")
    memory = _physical_memory() if memory is None else memory
    if on_this_machine and memory:  # on a cluster the replay server's node may have more
        # What the store allocates per unit of capacity: frames once when observations stack them.
        obs, act, stack, agents = spec.observation_space, spec.action_space, spec.frame_stack, spec.num_agents
        per_item = flat_item_bytes(obs, act, r.capacity, stack, agents, r.prioritized) \
            if algorithm(cfg.algo).data_path == "replay" \
            else sequence_step_bytes(obs, act, cfg.sequence.chunk_length, stack, agents)
        if r.capacity * per_item > memory:
            raise ConfigError(f"config key 'replay.capacity': {r.capacity} items need at least "
                              f"{_gib(r.capacity * per_item)} ({per_item} bytes each for {cfg.env.id}); this "
                              f"machine has {_gib(memory)} of memory")


def stored_obs_bytes(space) -> int:
    """Bytes of one observation as replay stores it: floats as float32, anything else in its own dtype."""
    from distrl.replay.sizing import stored_bytes

    return stored_bytes(space)


def _check_datasets(cfg: Config, algo, spec, resuming: bool) -> None:
    """An offline algorithm has a dataset that fits the env and the replay; log.dataset can be written."""
    from distrl.data.datasets import DatasetError, check_new_name, dataset_info, space_mismatch
    from distrl.registry import with_capability

    offline, dataset = algo.offline, cfg.data.dataset
    if offline and not dataset:
        raise ConfigError(f"config key 'data.dataset': {cfg.algo} learns from a dataset only: set data.dataset "
                          "(record one with `distrl record`, or with log.dataset in a training run)")
    if dataset and not offline:
        raise ConfigError(f"config key 'data.dataset': {cfg.algo} learns from its own workers (algorithms that "
                          f"learn from a dataset: {', '.join(with_capability('offline'))})")
    if dataset and cfg.mode == "async":
        raise ConfigError("config key 'mode': an offline run has no workers to wait for: use single or sync")
    try:
        if dataset:
            obs_space, act_space, steps = dataset_info(dataset)
            problem = space_mismatch(obs_space, spec.observation_space, "observation") or \
                space_mismatch(act_space, spec.action_space, "action")
            if problem:
                raise DatasetError(f"dataset {dataset}: {problem} ({cfg.env.id})")
            if steps > cfg.replay.capacity:
                raise DatasetError(f"dataset {dataset} holds {steps} steps, more than replay.capacity "
                                   f"({cfg.replay.capacity}): raise it to hold them all")
    except DatasetError as e:
        raise ConfigError(f"config key 'data.dataset': {e}") from None
    if cfg.log.dataset and not resuming:
        if algo.multi_agent:
            raise ConfigError(f"config key 'log.dataset': {cfg.algo}'s multi-agent episodes are not recorded")
        try:
            check_new_name(cfg.log.dataset)
        except DatasetError as e:
            raise ConfigError(f"config key 'log.dataset': {e}") from None


def _check_torsos(cfg: Config, spec) -> None:
    """The algorithm's torsos build for this env and map a sampled batch to features: a user's
    `model.torso` factory that cannot be imported, raises or returns the wrong shape is one line."""
    from distrl.models import TorsoError, check_torso, make_torso
    from distrl.roles.factory import make_algorithm

    algo = make_algorithm(cfg, spec)
    try:
        for space in algo.torso_spaces():
            check_torso(make_torso(space, cfg.model, algo.image_torso), space, cfg.model.torso)
        algo.build_network()
    except TorsoError as e:
        raise ConfigError(str(e)) from None


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _check_ray_only(cfg: Config) -> None:
    """Gradient workers and central inference: Ray actors, for the algorithms whose halves support them."""
    from distrl.registry import algorithm, with_capability

    wanted = [("learner.num_gradient_workers", cfg.learner.num_gradient_workers > 1, "gradient_workers",
               "has no gradient workers", "gradient workers"),
              ("rollout.inference", cfg.rollout.inference == "central", "central_inference",
               "acts only in its workers", "central inference")]
    for key, asked, flag, refusal, feature in wanted:
        if not asked:
            continue
        if not getattr(algorithm(cfg.algo), flag):
            able = ", ".join(with_capability(flag))
            raise ConfigError(f"config key '{key}': {cfg.algo} {refusal} (algorithms with {feature}: {able})")
        if cfg.mode == "single":
            raise ConfigError(f"config key '{key}': only modes sync and async start Ray actors for {feature}")


def _check_placement_amounts(cfg: Config) -> None:
    """Amounts Ray accepts: a positive number, at most 1 or whole (Ray refuses 1.5 of a resource)."""
    from distrl.runtime.ray_setup import ROLES

    for role in ROLES:
        for name, amount in getattr(cfg.placement, role).items():
            ok = isinstance(amount, (int, float)) and not isinstance(amount, bool) and 0 < amount < 2**31
            if not ok or (amount > 1 and amount != int(amount)) or not isinstance(name, str) or not name:
                # An unprintable name (a newline, say) appears as repr only: the error stays one line.
                key = f"placement.{role}" + (f".{name}" if isinstance(name, str) and name.isprintable() else "")
                raise ConfigError(f"config key '{key}': expected a resource name and an amount "
                                  f"in (0, 1] or a whole number, got {name!r}: {amount!r}")


def _check_multiagent_env(cfg: Config):
    """Build the multi-agent env, reset it and take one step: its one-agent spec, or EnvError."""
    import numpy as np

    from distrl.core import EnvSpec
    from distrl.envs import EnvError
    from distrl.envs.multiagent import make_multiagent_env

    if cfg.env.wrappers or cfg.env.preset != "none":
        key = "env.wrappers" if cfg.env.wrappers else "env.preset"
        raise EnvError(f"config key '{key}': multi-agent envs take no gymnasium wrappers or preset")
    env = make_multiagent_env(cfg.env.id, cfg.env.kwargs)
    try:
        env.reset(seed=0)
        env.step(np.zeros(env.num_agents, np.int64))
        return EnvSpec(env.observation_space, env.action_space, env.num_agents)
    except EnvError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the env raises, its config made it
        raise EnvError(f"config key 'env.kwargs': {cfg.env.id} fails on reset or step: {' '.join(str(e).split())[:200]}") from None
    finally:
        env.close()


def _check_device(device: str) -> None:
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"config key 'device': {device} requested but no CUDA device is visible")
    index = device.partition(":")[2]
    if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
        raise ConfigError(f"config key 'device': {device} does not exist "
                          f"({torch.cuda.device_count()} CUDA device(s) visible)")


def default_run_dir(cfg: Config) -> str:
    """runs/<algo>_<env>_<mode>_seed<N>_<time to the microsecond>-<random>: two runs started together never share one."""
    env = re.sub(r"[^A-Za-z0-9_.-]+", "-", cfg.env.id.split(":")[-1])
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
    return os.path.join("runs", f"{cfg.algo}_{env}_{cfg.mode}_seed{cfg.seed}_{stamp}-{secrets.token_hex(3)}")


def resolve_config(config: Config | dict | str | None, overrides: list[str] | None = None) -> Config:
    if isinstance(config, Config):
        # Rebuilt: checked like a file, and a base Config (the run sections only) gains its algorithm's.
        return from_dict(apply_overrides(to_dict(config), overrides or []))
    if isinstance(config, dict):
        return from_dict(apply_overrides(dict(config), overrides or []))
    return load_config(config, overrides)


def train(config: Config | dict | str | None = None, *, overrides: list[str] | None = None,
          run_dir: str | None = None, address: str | None = None,
          start_time: float | None = None) -> dict[str, Any]:
    """Train to a stop condition and return the run summary (also in run_dir/summary.json).

    `config` is a Config, a dict shaped like the YAML, or a YAML path; `overrides`
    are `section.key=value` strings. Raises ConfigError on bad input before
    anything is written.
    """
    start = start_time if start_time is not None else time.time()
    cfg = resolve_config(config, overrides)
    validate(cfg, address)
    # Absolute: actors on a cluster started from another directory resolve the same path.
    run_dir = os.path.abspath(run_dir or default_run_dir(cfg))
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(f"run dir {run_dir} is a file, not a directory")
    if os.path.exists(os.path.join(run_dir, "config.yaml")):
        raise ConfigError(f"run dir {run_dir} already holds a run; choose another --run-dir")
    from distrl.runtime.launch import run_training

    return run_training(cfg, run_dir, start, address)


def _run_config(run_dir: str, overrides: list[str] | None = None) -> Config:
    if not os.path.isdir(run_dir):
        raise ConfigError(f"run dir not found: {run_dir}")
    cfg_path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(cfg_path):
        raise ConfigError(f"{run_dir} is not a distrl run dir (no config.yaml)")
    try:
        return load_config(cfg_path, overrides)
    except ConfigError as e:  # a run dir of an older distrl, or an edited one
        raise ConfigError(f"{cfg_path} cannot be read by this distrl: {e}") from None


def resume(run_dir: str, *, overrides: list[str] | None = None, address: str | None = None) -> dict[str, Any]:
    """Continue `run_dir` from its newest complete checkpoint; returns the final summary.

    The config is the one saved in the checkpoint; `overrides` may change how the run goes on
    (stop.*, log.*, eval.*, workers, mode, ...; the budget counts the time already spent), not what
    the checkpoint's state was built with. Raises ConfigError / CheckpointError on a missing or live
    run dir, a bad checkpoint or an incompatible override.
    """
    from distrl.runtime.launch import resume_run

    run_dir = os.path.abspath(run_dir)
    if not os.path.isdir(run_dir):
        raise ConfigError(f"run dir not found: {run_dir}")
    if not os.path.isdir(os.path.join(run_dir, "checkpoints")):
        raise ConfigError(f"{run_dir} is not a distrl run dir (no checkpoints/)")
    return resume_run(run_dir, overrides or [], address, lambda cfg: validate(cfg, address, resuming=True))


def _best_policy(run_dir: str, cfg: Config):
    """The run's greedy policy (the evaluator's) loaded with its best checkpoint, and that checkpoint's meta."""
    from distrl.checkpoint import CheckpointError, load_weights
    from distrl.roles.factory import acting_policy

    weights, meta = load_weights(os.path.join(run_dir, "checkpoints", "best.safetensors"))
    policy = acting_policy(cfg, -1, 1)
    try:
        policy.set_weights(weights, int(meta.get("version", 0)))
    except RuntimeError as e:  # torch's strict load: a network built by other code or another config
        raise CheckpointError(f"{run_dir}/checkpoints/best.safetensors does not fit the network of its "
                              f"config.yaml: {str(e).splitlines()[0][:200]}") from None
    return policy, meta


def evaluate(run_dir: str, episodes: int = 20, seed: int = 12345, video: str | None = None) -> dict[str, Any]:
    """Greedy episodes with a run's best checkpoint: {"env", "returns", "mean", "std", "version"}; `video`:
    an mp4 path to film them into, one after another (then "frames" too).

    Raises ConfigError / CheckpointError on a missing run dir or a bad checkpoint (VideoError, a ConfigError,
    on an env without rgb_array rendering).
    """
    import numpy as np

    from distrl.registry import algorithm
    from distrl.roles.evaluation import episode_metrics, play_greedy

    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    cfg = _run_config(run_dir)
    policy, meta = _best_policy(run_dir, cfg)
    multi_agent, frames = algorithm(cfg.algo).multi_agent, None
    if video is not None:  # issue 28: `distrl eval --video`
        from distrl.roles.filming import film_greedy

        returns, infos, frames = film_greedy(policy, cfg.env, episodes, seed, video, multi_agent)
    else:
        returns, infos = play_greedy(policy, cfg.env.id, episodes, seed, cfg.env.kwargs, multi_agent=multi_agent,
                                     wrappers=cfg.env.wrappers, preset=cfg.env.preset)
    return {"env": cfg.env.id, "returns": returns.tolist(), "mean": float(np.mean(returns)), "frames": frames,
            "std": float(np.std(returns)), "version": meta.get("version"), "metrics": episode_metrics(infos)}


def record(run_dir: str, episodes: int, output: str, epsilon: float = 0.0, explore: bool = False,
           seed: int = 12345) -> dict[str, Any]:
    """Play a run's best checkpoint for `episodes` whole episodes into a new Minari dataset at `output`
    (greedy, or with its own exploration, or epsilon-random actions): {"dataset", "episodes", "steps",
    "return_mean", "return_std"}. Raises ConfigError / CheckpointError on bad input."""
    import numpy as np

    from distrl.config import to_dict
    from distrl.data.datasets import DatasetError, DatasetWriter, check_new_name
    from distrl.registry import algorithm
    from distrl.roles.factory import spec_of
    from distrl.roles.recording import play_episodes

    if episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {episodes}")
    if not 0.0 <= epsilon <= 1.0:
        raise ConfigError(f"--epsilon must be in [0, 1], got {epsilon}")
    cfg = _run_config(run_dir)
    if algorithm(cfg.algo).multi_agent:
        raise ConfigError(f"{run_dir}: {cfg.algo}'s multi-agent episodes cannot be recorded")
    try:
        check_new_name(output)
    except DatasetError as e:
        raise ConfigError(str(e)) from None
    policy, meta = _best_policy(run_dir, cfg)
    played = play_episodes(policy, cfg.env, episodes, seed, epsilon, explore)
    spec = spec_of(cfg.env, multi_agent=False)
    writer = DatasetWriter(output, spec.observation_space, spec.action_space, {
        "source": "record", "algo": cfg.algo, "env": cfg.env.id, "seed": seed, "run_dir": os.path.abspath(run_dir),
        "checkpoint_version": meta.get("version"), "epsilon": epsilon, "explore": explore, "config": to_dict(cfg)})
    writer.add(played)
    returns = np.array([ep.rewards.sum() for ep in played])
    return {"dataset": writer.path, "episodes": len(played), "steps": int(sum(len(ep.actions) for ep in played)),
            "return_mean": float(returns.mean()), "return_std": float(returns.std())}
