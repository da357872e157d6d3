"""What is checked before a run starts, with nothing written yet: the config against the env, the algorithm,
the machine (workers it can host, memory for the replay, a CUDA device) and, with `address`, the cluster.
Each problem is a `ConfigError` naming the key."""
from __future__ import annotations

import os

from distrl.config import Config, ConfigError
from distrl.config.sections import EnvConfig, NormalizeConfig, PlacementConfig
from distrl.threads import usable_cpus


# Rollout workers one machine hosts without a cluster: beyond a few per core they only contend,
# and each is a process with its own interpreter and envs.
WORKERS_PER_CORE, WORKER_MB = 8, 300


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
        spec = _check_multiagent_env(cfg.env) if algo.multi_agent else check_env(
            cfg.env.id, cfg.env.kwargs, wrappers=cfg.env.wrappers, preset=cfg.env.preset, normalize=cfg.env.normalize,
            obs_keys=cfg.env.obs_keys, action_mask=cfg.env.action_mask)
    except EnvError as e:
        raise ConfigError(str(e)) from None
    spec = _check_external(cfg.external, cfg.env, algo, spec)
    problem = algo.check_spec(spec)
    if problem:
        raise ConfigError(f"config key 'algo': {problem} ({cfg.env.id})")
    from distrl.roles.factory import make_algorithm

    built = make_algorithm(cfg, spec)
    problem = built.check_config()
    if problem:
        raise ConfigError(f"{problem} ({cfg.env.id})")
    _check_torsos(built, cfg.model)
    _check_recurrence(cfg, algo)
    _check_normalize(cfg.env.normalize, algo.multi_agent, bool(cfg.data.dataset), cfg.rollout.inference)
    _check_datasets(cfg, algo, spec, resuming)
    if cfg.eval.epsilon > 0.0 and algo.multi_agent:
        raise ConfigError(f"config key 'eval.epsilon': random evaluation actions are for single-agent envs; "
                          f"{cfg.algo} plays multi-agent ones (use 0)")
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
    _check_ray_only(cfg.algo, cfg.mode, cfg.learner.num_gradient_workers, cfg.rollout.inference)
    from distrl.roles.filming import check_outputs  # log.wandb / log.mlflow installed, videos renderable

    check_outputs(cfg.log, cfg.eval, cfg.env, algo.multi_agent)
    if cfg.mode != "single":  # single mode starts no Ray: placement does not apply
        _check_placement_amounts(cfg.placement)
        from distrl.runtime.ray_setup import check_placement, roster, user_modules

        # Last: it joins (or starts) the Ray the run will use.
        check_placement(roster(cfg, bool(address)), address, user_modules(cfg.model))


def _check_recurrence(cfg: Config, algo) -> None:
    """rollout.recurrence for an on-policy core only, dividing the fragments it cuts."""
    core = getattr(cfg.model, "core", "none")
    recurrence = cfg.rollout.recurrence
    if recurrence is not None and (core == "none" or algo.data_path not in ("trajectory", "gradients")):
        raise ConfigError("config key 'rollout.recurrence': it cuts fragments into trained sequences for an "
                          f"on-policy learner with a model.core; this {cfg.algo} run has none (leave it null)")
    if recurrence is not None and cfg.rollout.fragment_length % recurrence:
        raise ConfigError(f"config key 'rollout.recurrence': {recurrence} does not divide "
                          f"rollout.fragment_length {cfg.rollout.fragment_length} (each fragment is cut into "
                          "whole sequences)")


def _check_replay(cfg: Config, spec, on_this_machine: bool, memory: int | None = None) -> None:
    """A batch the replay can hold, a rate limiter that cannot stall, a capacity the machine (`memory` bytes,
    by default its physical memory) can hold."""
    from distrl.registry import algorithm
    from distrl.replay.rate_limiter import RateLimiter
    from distrl.replay.sizing import flat_item_bytes, sequence_step_bytes
    from distrl.runtime.pacing import pacing

    r, batch = cfg.replay, cfg.learner.batch_size
    if r.min_size > r.capacity:
        raise ConfigError("config key 'replay.min_size': larger than replay.capacity, learning would never start")
    if batch > r.capacity:
        raise ConfigError(f"config key 'learner.batch_size': {batch} is larger than replay.capacity ({r.capacity})")
    if not RateLimiter.deadlock_free(r.samples_per_insert, pacing(cfg).error_buffer, batch):
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


def _check_external(ext, env_cfg, algo, spec):
    """`ext` (the external section) enabled: an algorithm that learns from simulators' steps, declared spaces
    that parse and agree with `env_cfg.id`'s (the evaluator plays it), an address the server can listen on.
    The spec the run's networks are built for."""
    import socket

    from distrl.envs.spaces import same_space
    from distrl.registry import with_capability
    from distrl.roles.factory import external_spec

    if not ext.enabled:
        return spec
    if not algo.external:
        why = ("it learns from a dataset only" if algo.offline else
               "its workers send gradients of their own copy of the loss" if algo.data_path == "gradients" else
               "it acts with a recurrent state per episode and stores sequences with it")
        raise ConfigError(f"config key 'external.enabled': {algo.name} cannot learn from external simulators: {why} "
                          f"(algorithms that can: {', '.join(with_capability('external'))})")
    if spec.frame_stack:
        raise ConfigError(f"config key 'env.id': {env_cfg.id} stacks frames, which simulators' observations do not "
                          "share; declare external.observation_space (whole stacks) and an env.id that does not stack")
    try:
        declared = external_spec(env_cfg, ext)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for side, mine, env in (("observation", declared.observation_space, spec.observation_space),
                            ("action", declared.action_space, spec.action_space)):
        if not same_space(mine, env, bounds=side == "action"):
            raise ConfigError(f"config key 'external.{side}_space': {mine} is not {env_cfg.id}'s {env}, which the "
                              "evaluator plays with the network built for it")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((ext.host, ext.port))
    except (OSError, OverflowError) as e:
        raise ConfigError(f"config key 'external.host': the simulator server cannot listen on {ext.host}:{ext.port} "
                          f"({getattr(e, 'strerror', None) or e})") from None
    return declared


def _check_torsos(algo, model) -> None:
    """The algorithm's (built for the env) torsos, from the `model` section, build and map a sampled batch
    to features: a user's `model.torso` factory that cannot be imported, raises or returns the wrong shape
    is one line."""
    from distrl.models import TorsoError, check_torso, make_torso

    try:
        for space in algo.torso_spaces():
            check_torso(make_torso(space, model, algo.image_torso), space, model.torso)
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


def _check_normalize(n: NormalizeConfig, multi_agent: bool, offline: bool, inference: str) -> None:
    """env.normalize: statistics gathered by rollout workers that act in their own process."""
    if not (n.obs or n.reward):
        return
    why = ("multi-agent envs are not normalized" if multi_agent else
           "an offline run has no rollout workers to gather statistics" if offline else
           "workers normalize with the statistics that come with their weights, which central inference keeps "
           "on its server (use rollout.inference: local)" if inference == "central" else None)
    if why:
        raise ConfigError(f"config key 'env.normalize': {why}")


def _check_ray_only(algo: str, mode: str, gradient_workers: int, inference: str) -> None:
    """Gradient workers and central inference (`learner.num_gradient_workers`, `rollout.inference`): Ray
    actors, for the algorithms whose halves support them."""
    from distrl.registry import algorithm, with_capability

    wanted = [("learner.num_gradient_workers", gradient_workers > 1, "gradient_workers",
               "has no gradient workers", "gradient workers"),
              ("rollout.inference", inference == "central", "central_inference",
               "acts only in its workers", "central inference")]
    for key, asked, flag, refusal, feature in wanted:
        if not asked:
            continue
        if not getattr(algorithm(algo), flag):
            able = ", ".join(with_capability(flag))
            raise ConfigError(f"config key '{key}': {algo} {refusal} (algorithms with {feature}: {able})")
        if mode == "single":
            raise ConfigError(f"config key '{key}': only modes sync and async start Ray actors for {feature}")


def _check_placement_amounts(placement: PlacementConfig) -> None:
    """Amounts Ray accepts: a positive number, at most 1 or whole (Ray refuses 1.5 of a resource)."""
    from distrl.runtime.ray_setup import ROLES

    for role in ROLES:
        for name, amount in getattr(placement, role).items():
            ok = isinstance(amount, (int, float)) and not isinstance(amount, bool) and 0 < amount < 2**31
            if not ok or (amount > 1 and amount != int(amount)) or not isinstance(name, str) or not name:
                # An unprintable name (a newline, say) appears as repr only: the error stays one line.
                key = f"placement.{role}" + (f".{name}" if isinstance(name, str) and name.isprintable() else "")
                raise ConfigError(f"config key '{key}': expected a resource name and an amount "
                                  f"in (0, 1] or a whole number, got {name!r}: {amount!r}")


def _check_multiagent_env(env_cfg: EnvConfig):
    """Build the multi-agent env of the `env` section, reset it and take one step: its one-agent spec, or
    EnvError."""
    import numpy as np

    from distrl.envs import EnvError
    from distrl.envs.multiagent import make_multiagent_env
    from distrl.roles.factory import multiagent_spec

    if env_cfg.wrappers or env_cfg.preset != "none":
        key = "env.wrappers" if env_cfg.wrappers else "env.preset"
        raise EnvError(f"config key '{key}': multi-agent envs take no gymnasium wrappers or preset")
    env = make_multiagent_env(env_cfg.id, env_cfg.kwargs, env_cfg.obs_keys, env_cfg.action_mask)
    try:
        env.reset(seed=0)
        env.step(np.zeros((env.num_agents, *env.action_space.shape), env.action_space.dtype))  # a Box's or Discrete's
        return multiagent_spec(env)
    except EnvError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the env raises, its config made it
        raise EnvError(f"config key 'env.kwargs': {env_cfg.id} fails on reset or step: {' '.join(str(e).split())[:200]}") from None
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
