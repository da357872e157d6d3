"""The Python API: `train(config) -> summary`, `resume(run_dir)`, `evaluate(run_dir)`; usable from a notebook."""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from distrl.checks import validate
from distrl.config import Config, ConfigError, apply_overrides, from_dict, load_config, to_dict


def default_run_dir(algo: str, env_id: str, mode: str, seed: int) -> str:
    """runs/<algo>_<env>_<mode>_seed<N>_<time to the microsecond>-<random>: two runs started together never share one."""
    from distrl.checkpoint.files import fresh_dir  # not at import: it loads safetensors

    return fresh_dir("runs", algo, env_id, mode, f"seed{seed}")


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
    run_dir = os.path.abspath(run_dir or default_run_dir(cfg.algo, cfg.env.id, cfg.mode, cfg.seed))
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


def _run_weights(run_dir: str, cfg: Config) -> tuple[dict, dict]:
    """(weights, meta) a run's policy is played and exported with: its best checkpoint's (the newest weights
    the evaluator scored best); in a run none of whose evaluations finished, its newest checkpoint's learner's,
    said in one line on stderr."""
    import numpy as np

    from distrl.checkpoint import CheckpointError, load_weights
    from distrl.checkpoint.read import load_latest, read_learner
    from distrl.roles.factory import make_algorithm

    best = os.path.join(run_dir, "checkpoints", "best.safetensors")
    if os.path.exists(best):
        return load_weights(best)
    try:
        path, state = load_latest(run_dir, read_learner)
    except CheckpointError as e:
        raise CheckpointError(f"{best} not found (no evaluation of the run finished) and {e}") from None
    learner = make_algorithm(cfg).make_learner("cpu")
    try:
        learner.load_state_dict(state["state"])
    except (RuntimeError, KeyError, ValueError, TypeError) as e:  # another network or algorithm
        raise CheckpointError(f"{path} does not fit the learner of its config.yaml: "
                              f"{str(e).splitlines()[0][:200]}") from None
    weights = {**learner.get_weights(), **{k: np.asarray(v) for k, v in state.get("statistics", {}).items()}}
    print(f"distrl: warning: {run_dir} has no best checkpoint (no evaluation finished): using the weights of its "
          f"newest checkpoint, {os.path.basename(path)} (version {state['version']})", file=sys.stderr)
    return weights, {"version": state["version"], "checkpoint": path}


def _run_policy(run_dir: str, cfg: Config):
    """The run's greedy policy (the evaluator's) loaded with `_run_weights`, those weights and their meta."""
    from distrl.checkpoint import CheckpointError
    from distrl.roles.factory import acting_policy

    weights, meta = _run_weights(run_dir, cfg)
    policy = acting_policy(cfg, -1, 1)
    try:
        policy.set_weights(weights, int(meta.get("version", 0)))
    except RuntimeError as e:  # torch's strict load: a network built by other code or another config
        raise CheckpointError(f"the weights of {run_dir}/checkpoints do not fit the network of its "
                              f"config.yaml: {str(e).splitlines()[0][:200]}") from None
    return policy, weights, meta


def _observation_normalization(weights: dict, cfg, space) -> tuple | None:
    """({leaf: (mean, 1 / std)}, clip) of the observation statistics `weights` came with, when the run
    normalized observations (`cfg`: its env.normalize section; `space`: the policy's observation space,
    whose float Box leaves were normalized); else None."""
    from distrl.envs.normalize import Normalization, normalized_leaves

    if not cfg.obs:
        return None
    normalization = Normalization(cfg, training=False, leaves=normalized_leaves(space))
    normalization.load(weights)
    return {leaf: normalization.obs_stats.get(leaf, (0.0, 1.0)) for leaf in normalization.leaves}, cfg.clip


def export(run_dir: str, onnx: str | None = None, torchscript: str | None = None) -> dict[str, Any]:
    """Write the acting network of a run's best checkpoint (the newest weights the evaluator scored best; see
    `_run_weights`) to `onnx` and/or `torchscript`: obs -> action (greedy) and the policy's outputs.
    {"files", "outputs", "version"}. ConfigError for a policy that does not export (recurrent) or a file that
    cannot be written; nothing is left half-written."""
    from distrl.models.export import ExportError, acting_network, example_batch, onnx_bytes, torchscript_bytes, \
        write_atomically

    if not onnx and not torchscript:
        raise ConfigError("export needs --onnx FILE and/or --torchscript FILE")
    cfg = _run_config(run_dir)
    policy, weights, meta = _run_policy(run_dir, cfg)
    try:
        module = acting_network(policy, _observation_normalization(weights, cfg.env.normalize, policy.acting_space))
    except ExportError as e:
        raise ConfigError(f"{run_dir}: {cfg.algo}'s policy cannot be exported: {e}") from None
    example = example_batch(policy.acting_space)
    written = {}
    for path, write in ((onnx, onnx_bytes), (torchscript, torchscript_bytes)):
        if path:
            try:
                data = write(module, example)  # built before anything is written: a failure leaves no file
            except ImportError as e:  # torch's ONNX exporter needs the onnx package
                raise ConfigError(f"--onnx needs the onnx package ({e}): pip install distrl[onnx]") from None
            try:
                write_atomically(path, data)
            except OSError as e:
                raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
            written[path] = len(data)
    return {"files": written, "outputs": ["action", *module.names], "version": meta.get("version")}


def evaluate(run_dir: str, episodes: int = 20, seed: int = 12345, video: str | None = None) -> dict[str, Any]:
    """Greedy episodes with a run's best checkpoint (see `_run_weights`): {"env", "returns", "mean", "std",
    "version"}; `video`: an mp4 path to film them into, one after another (then "frames" too).

    Raises ConfigError / CheckpointError on a missing run dir or a bad checkpoint (VideoError, a ConfigError,
    on an env without rgb_array rendering).
    """
    import numpy as np

    from distrl.registry import algorithm
    from distrl.roles.evaluation import episode_metrics, play_greedy

    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    cfg = _run_config(run_dir)
    policy, _, meta = _run_policy(run_dir, cfg)
    multi_agent, frames = algorithm(cfg.algo).multi_agent, None
    if video is not None:  # `distrl eval --video`
        from distrl.roles.filming import film_greedy

        returns, infos, frames = film_greedy(policy, cfg.env, episodes, seed, video, multi_agent)
    else:
        returns, infos = play_greedy(policy, cfg.env.id, episodes, seed, cfg.env.kwargs, multi_agent=multi_agent,
                                     wrappers=cfg.env.wrappers, preset=cfg.env.preset, epsilon=cfg.eval.epsilon,
                                     normalize=cfg.env.normalize, obs_keys=cfg.env.obs_keys,
                                     action_mask=cfg.env.action_mask)
    return {"env": cfg.env.id, "returns": returns.tolist(), "mean": float(np.mean(returns)), "frames": frames,
            "std": float(np.std(returns)), "version": meta.get("version"), "metrics": episode_metrics(infos)}


def record(run_dir: str, episodes: int, output: str, epsilon: float = 0.0, explore: bool = False,
           seed: int = 12345) -> dict[str, Any]:
    """Play a run's best checkpoint (see `_run_weights`) for `episodes` whole episodes into a new Minari dataset
    at `output` (greedy, or with its own exploration, or epsilon-random actions): {"dataset", "episodes", "steps",
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
    policy, _, meta = _run_policy(run_dir, cfg)
    played = play_episodes(policy, cfg.env, episodes, seed, epsilon, explore)
    spec = spec_of(cfg.env, multi_agent=False)
    writer = DatasetWriter(output, spec.observation_space, spec.action_space, {
        "source": "record", "algo": cfg.algo, "env": cfg.env.id, "seed": seed, "run_dir": os.path.abspath(run_dir),
        "checkpoint_version": meta.get("version"), "epsilon": epsilon, "explore": explore, "config": to_dict(cfg)})
    writer.add(played)
    returns = np.array([ep.rewards.sum() for ep in played])
    return {"dataset": writer.path, "episodes": len(played), "steps": int(sum(len(ep.actions) for ep in played)),
            "return_mean": float(returns.mean()), "return_std": float(returns.std())}
