"""Hyperparameter sweeps on Ray Tune (`distrl tune`): each trial a distrl run, a table of them at the end.

SWEEP_DIR holds sweep.json (what was asked: the resolved config, the searched keys, the search, the
scheduler; what `--resume` reads), tune/ (Tune's experiment), runs/<trial> (each trial's run dir: plot,
report and resume work on it as on any run) and trials.csv (the table). Trials ask Tune for the resources
their mode uses (single: one CPU; sync and async: one per worker and one for the learner) and share the
Ray cluster the sweep runs on (embedded, or the one `--address` points to).

A killed sweep resumes (`distrl tune --resume SWEEP_DIR`) without running finished trials again: Tune's
experiment state is saved at every step (TUNE_GLOBAL_CHECKPOINT_S=0; by default up to 10 s of finished
trials would run again) and a trial whose run dir has summary.json only reports it.
"""
from __future__ import annotations

import glob
import json
import math
import os
import re

import yaml

from distrl.checkpoint.files import fresh_dir
from distrl.config import ConfigError, from_dict, to_dict
from distrl.config.parse import FLOAT_TEXT
from distrl.runtime.ray_setup import ROLES, Roster, roster
from distrl.runtime.tune_table import sweep_table, write_table

SPEC_FILE, TUNE_DIR = "sweep.json", "tune"
DISTRIBUTIONS = ("uniform", "loguniform", "randint", "qrandint")
SCHEDULERS, SEARCHES = ("none", "asha"), ("grid", "random")


def split_values(text: str) -> list[str]:
    """'1e-3,3e-4' -> ['1e-3', '3e-4']; commas inside brackets, braces, parentheses or quotes do not split."""
    out, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    return out + [cur]


def _value(raw: str):
    """A value as `--set` reads it (YAML), with 1e-3 (a string to YAML 1.1) read as the number."""
    try:
        value = yaml.safe_load(raw.strip()) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw.strip()
    return float(value) if isinstance(value, str) and FLOAT_TEXT.match(value) else value


def parse_axis(text: str) -> tuple[str, dict]:
    """'ppo.lr=1e-3,3e-4' -> ('ppo.lr', {"values": [0.001, 0.0003]}); 'ppo.lr=loguniform(1e-4,1e-2)' ->
    ('ppo.lr', {"dist": "loguniform", "args": [0.0001, 0.01]})."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not raw.strip():
        raise ConfigError(f"--grid {text!r}: expected section.key=value1,value2,... or section.key=loguniform(low,high)")
    m = re.fullmatch(r"\s*(\w+)\((.*)\)\s*", raw)
    if m and m.group(1) in DISTRIBUTIONS:
        args = [_value(a) for a in split_values(m.group(2))]
        if len(args) != 2 or not all(isinstance(a, (int, float)) and math.isfinite(a) for a in args) or args[0] >= args[1]:
            raise ConfigError(f"--grid {key}: {m.group(1)}(low,high) needs two numbers, low < high, got {raw!r}")
        if m.group(1) == "loguniform" and args[0] <= 0:
            raise ConfigError(f"--grid {key}: loguniform needs low > 0, got {args[0]}")
        return key, {"dist": m.group(1), "args": args}
    values = [_value(v) for v in split_values(raw)]
    if any(isinstance(v, str) and not v.strip() for v in values):
        raise ConfigError(f"--grid {key}: an empty value in {raw!r}")
    return key, {"values": values}


def _space(axis: dict, search: str):
    from ray import tune

    if "dist" in axis:
        low, high = axis["args"]
        return {"uniform": tune.uniform, "loguniform": tune.loguniform, "randint": tune.randint,
                "qrandint": tune.qrandint}[axis["dist"]](low, high)
    return tune.grid_search(axis["values"]) if search == "grid" else tune.choice(axis["values"])


def check_spec(spec: dict, validate) -> None:
    """ConfigError (one line naming the key or flag) for a sweep that cannot run; nothing is written."""
    if spec["search"] not in SEARCHES:
        raise ConfigError(f"--search: expected one of {', '.join(SEARCHES)}, got {spec['search']!r}")
    if spec["scheduler"] not in SCHEDULERS:
        raise ConfigError(f"--scheduler: expected one of {', '.join(SCHEDULERS)}, got {spec['scheduler']!r}")
    if spec["samples"] < 1 or (spec["max_concurrent"] is not None and spec["max_concurrent"] < 1):
        raise ConfigError("--samples and --max-concurrent must be >= 1")
    if not spec["axes"]:
        raise ConfigError("nothing to sweep: give at least one --grid section.key=value1,value2")
    keys = [k for k, _ in spec["axes"]]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"--grid: a key is given twice ({', '.join(sorted(k for k in set(keys) if keys.count(k) > 1))})")
    if spec["metric"] not in ("best_eval_return", "eval_return_mean", "eval_success_rate", "train_return_mean"):
        raise ConfigError(f"--metric: expected best_eval_return, eval_return_mean, eval_success_rate or "
                          f"train_return_mean, got {spec['metric']!r}")
    first = []
    for key, axis in spec["axes"]:
        values = axis.get("values") or axis["args"]
        for v in values:  # each value on its own: the error names the key
            from_dict(_apply(spec["config"], [f"{key}={json.dumps(v)}"]))
        first.append(f"{key}={json.dumps(values[0])}")
    validate(from_dict(_apply(spec["config"], first)), spec["address"])  # the first trial, fully


def _apply(config: dict, overrides: list[str]) -> dict:
    from distrl.config import apply_overrides

    return apply_overrides(json.loads(json.dumps(config)), overrides)


def trial_resources(mode: str, plan: Roster, address: str | None, cluster_cpus: float):
    """What one trial asks Tune for: one CPU for a single-mode trial (its process trains; + a GPU for a cuda
    learner); for sync and async one CPU for the trial's driver and learner and one per worker. Embedded,
    the run's actors ask Ray for nothing, so this only paces the trials, and at most the machine's CPUs are
    asked (one such trial at a time); on a cluster the bundles hold what the actors ask for (a CPU each, and
    their `placement`), and a trial the cluster cannot hold is a ConfigError."""
    from ray import tune

    gpu = {"GPU": 1.0} if plan.device.startswith("cuda") else {}
    if mode == "single":
        return tune.PlacementGroupFactory([{"CPU": 1.0, **gpu}])
    if not address:
        return tune.PlacementGroupFactory([{"CPU": float(min(plan.counts["workers"] + 1, cluster_cpus)), **gpu}])
    bundles = [{"CPU": 1.0}]  # the trial's driver
    for role in ROLES:
        asks = {k: v for k, v in plan.resources[role].items() if v > 0}
        bundles += [asks] * plan.counts[role] if asks else []
    cpus = sum(b.get("CPU", 0.0) for b in bundles)
    if cpus > cluster_cpus:
        raise ConfigError(f"config key 'workers': a {mode} trial with {plan.counts['workers']} workers needs "
                          f"{cpus:g} CPUs; the cluster at {address} has {cluster_cpus:g}")
    return tune.PlacementGroupFactory(bundles)


def default_sweep_dir(algo: str, env_id: str) -> str:
    return fresh_dir("sweeps", algo, env_id)


def _tuner(spec: dict, trainable, restore: bool):
    from ray import tune

    path = os.path.join(spec["dir"], TUNE_DIR)
    if restore:
        return tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=False,
                                  restart_errored=False)
    scheduler = None
    if spec["scheduler"] == "asha":
        from distrl.runtime.tune_trial import EarlyStopASHA

        cfg = from_dict(spec["config"])
        time_attr, max_t = ("env_steps", cfg.stop.max_env_steps) if cfg.stop.max_env_steps else ("wall_s", cfg.stop.max_seconds)
        grace = spec.get("grace_period") or max_t / 4
        scheduler = EarlyStopASHA(spec["dir"], time_attr=time_attr, max_t=max_t, grace_period=grace,
                                  reduction_factor=2)
    space = {key: _space(axis, spec["search"]) for key, axis in spec["axes"]}
    return tune.Tuner(
        trainable, param_space=space,
        tune_config=tune.TuneConfig(metric=spec["metric"], mode="max", scheduler=scheduler,
                                    num_samples=spec["samples"], max_concurrent_trials=spec["max_concurrent"],
                                    trial_dirname_creator=lambda trial: trial.trial_id),
        run_config=tune.RunConfig(name=TUNE_DIR, storage_path=os.path.abspath(spec["dir"]), verbose=0,
                                  callbacks=_callbacks(), failure_config=tune.FailureConfig(max_failures=0)))


def _callbacks() -> list:
    """Tune's JSON and CSV result loggers (its results read them back; its TensorBoard one needs tensorboardX,
    and each run dir has its own TensorBoard events), and a line per trial."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from distrl.runtime.tune_trial import SweepCallback

    return [JsonLoggerCallback(), CSVLoggerCallback(), SweepCallback()]


def _fit(spec: dict, train, resume, restore: bool) -> dict:
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")  # state saved at every step: see the module doc
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no status boxes (a line per trial instead)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # its JSON and CSV loggers are added below
    import ray
    from ray import tune

    from distrl.runtime.ray_setup import init_ray
    from distrl.runtime.tune_trial import trial_main

    init_ray(spec["address"])
    cfg = from_dict(spec["config"])
    resources = trial_resources(cfg.mode, roster(cfg, bool(spec["address"])), spec["address"],
                                ray.cluster_resources().get("CPU", 1.0))
    trainable = tune.with_resources(tune.with_parameters(trial_main, sweep=spec, train=train, resume=resume),
                                    resources)
    grid = _tuner(spec, trainable, restore).fit()
    rows = sweep_table(spec, grid)
    write_table(spec["dir"], rows)
    return {"dir": spec["dir"], "trials": rows}


def run_sweep(config, axes: list[str], *, train, resume, validate, overrides: list[str] | None = None,
              sweep_dir: str | None = None, samples: int = 1, search: str = "grid", scheduler: str = "none",
              metric: str = "best_eval_return", max_concurrent: int | None = None, address: str | None = None,
              grace_period: float | None = None) -> dict:
    """Run a sweep to its end: {"dir": the sweep dir, "trials": the table of its trials, best first}. `config` is a YAML path or a dict;
    `axes` are `--grid` texts; `train`, `resume`, `validate` are distrl.api's and distrl.checks'. ConfigError (nothing
    written) on bad input."""
    from distrl.config import load_config

    base = load_config(config, overrides) if isinstance(config, str) else from_dict(_apply(config, overrides or []))
    spec = {"config": to_dict(base), "axes": [parse_axis(a) for a in axes], "samples": samples, "search": search,
            "scheduler": scheduler, "metric": metric, "max_concurrent": max_concurrent, "address": address,
            "grace_period": grace_period, "cwd": os.getcwd()}
    check_spec(spec, validate)
    spec["dir"] = os.path.abspath(sweep_dir or default_sweep_dir(base.algo, base.env.id))
    if os.path.exists(os.path.join(spec["dir"], SPEC_FILE)):
        raise ConfigError(f"{spec['dir']} already holds a sweep: resume it with --resume, or choose another --dir")
    if os.path.exists(spec["dir"]) and not os.path.isdir(spec["dir"]):
        raise ConfigError(f"sweep dir {spec['dir']} is a file, not a directory")
    os.makedirs(spec["dir"], exist_ok=True)
    with open(os.path.join(spec["dir"], SPEC_FILE), "w") as fh:
        json.dump(spec, fh, indent=1)
    return _fit(spec, train, resume, restore=False)


def resume_sweep(sweep_dir: str, *, train, resume, address: str | None = None) -> dict:
    """Continue a killed sweep: trials that finished are not run again; as `run_sweep`, all its trials."""
    from ray import tune

    path = os.path.join(sweep_dir, SPEC_FILE)
    try:
        with open(path) as fh:
            spec = json.load(fh)
    except (OSError, ValueError):
        raise ConfigError(f"{sweep_dir} is not a distrl sweep dir (no readable {SPEC_FILE})") from None
    spec["dir"] = os.path.abspath(sweep_dir)  # it may have moved
    spec["address"] = address if address is not None else spec.get("address")
    if not tune.Tuner.can_restore(os.path.join(spec["dir"], TUNE_DIR)):
        raise ConfigError(f"{sweep_dir}: Tune saved no experiment state there yet (it was killed at once): "
                          "start the sweep again")
    _check_tune_state(os.path.join(spec["dir"], TUNE_DIR))
    return _fit(spec, train, resume, restore=True)


def _check_tune_state(tune_dir: str) -> None:
    """Tune restores from the newest of its state files; one cut short by the kill (Tune copies them into
    place, not atomically) makes it start the whole sweep over, silently: refuse that in one line."""
    import ray.cloudpickle

    for pattern, load in (("experiment_state-*.json", json.load), ("basic-variant-state-*.json", ray.cloudpickle.load)):
        paths = sorted(glob.glob(os.path.join(tune_dir, pattern)))
        if paths:
            try:
                with open(paths[-1], "rb") as fh:
                    load(fh)
            except Exception:  # noqa: BLE001 - whatever a cut file raises (EOFError, UnpicklingError, ValueError)
                raise ConfigError(f"{paths[-1]} is cut short (the sweep was killed while Tune wrote it): Tune cannot "
                                  "resume this sweep; start it again in a new --dir") from None
