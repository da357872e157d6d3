"""Any value of any type for any config key: the run starts, or one line and exit 2 (never a traceback).

Values that validate are started for real, in single mode with a tiny budget, so a value the
checks let through but a role then chokes on is caught too. The keys only sync and async read are
validated against a stand-in for Ray's view of a cluster, not run (each run would start Ray).
"""
import dataclasses
import os
import typing
import uuid

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from distrl.cli import main
from distrl.config import config_class

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
TINY = ["stop.max_env_steps=512", "stop.max_seconds=30", "log.progress=false", "log.tensorboard=false",
        "eval.episodes=2", "mode=single"]
SKIP = {"mode", "algo"}  # other modes start Ray; other algorithms other envs: covered elsewhere


def keys(cls=config_class("apex_dqn"), prefix=""):  # every key CARTPOLE's config has
    hints = typing.get_type_hints(cls)
    for fl in dataclasses.fields(cls):
        name = prefix + fl.metadata.get("key", fl.name)
        if dataclasses.is_dataclass(hints[fl.name]):
            yield from keys(hints[fl.name], name + ".")
        elif name not in SKIP:
            yield name


KEYS = sorted(keys())
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.sampled_from([0, 1, 2, 7, 64, 10**6]),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 1.0, 1e-9, -1.0]),
                    st.text(max_size=8), st.sampled_from(["cpu", "auto", "lstm", "CartPole-v1", ""]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=4), SCALARS, max_size=2))


def yaml_text(value) -> str:
    import json

    return json.dumps(value, allow_nan=True).replace("NaN", ".nan").replace("-Infinity", "-.inf").replace("Infinity", ".inf")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(KEYS), value=VALUES)
def test_any_value_for_any_key_starts_or_is_one_line_exit_2(capsys, tmp_path, key, value):
    run_dir = tmp_path / uuid.uuid4().hex  # tmp_path is shared by every example
    argv = ["train", CARTPOLE, "--run-dir", str(run_dir), *sum((["--set", t] for t in TINY), []),
            "--set", f"{key}={yaml_text(value)}"]
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("distrl: error: "), err
        assert not run_dir.exists()
    else:
        assert code in (0, 1), (code, err)
        assert (run_dir / "summary.json").exists()


# Keys only the Ray modes read. Their values are validated, not run: a run would start Ray for each example.
RAY_KEYS = ["workers", "fault.worker_timeout_s", "fault.role_timeout_s", "fault.max_worker_restarts",
            "fault.max_role_restarts", "async.window_s", "learner.num_gradient_workers", "rollout.inference",
            "rollout.batch_timeout_ms", "placement.workers_strategy",
            *(f"placement.{role}" for role in ("learner", "workers", "replay", "evaluator", "parameter_server",
                                               "gradient_workers", "inference"))]
SECONDS = st.one_of(st.floats(0, 1e20), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([1e18, 9.3e15, 604800, 604801, 1e-9, 2]))
AMOUNTS = st.one_of(st.integers(-3, 2**40), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.sampled_from([0.5, 1, 2, 4, 1.5]), st.text(max_size=3), st.none())
RESOURCES = st.dictionaries(st.one_of(st.sampled_from(["CPU", "GPU", "node_a", "slot", "memory", ""]), st.text(max_size=4),
                                      st.integers(0, 3)), AMOUNTS, max_size=3)
CHOICES = st.sampled_from(["default", "spread", "pack", "central", "local"])


def ray_item(key: str):
    """(key, a value of any type, more often one of the kind the key takes)."""
    kind = RESOURCES if key.startswith("placement.") and key != "placement.workers_strategy" else (
        SECONDS if key.endswith(("_s", "_ms")) else CHOICES if key in ("rollout.inference", "placement.workers_strategy")
        else st.one_of(st.integers(0, 8), st.integers(-2, 10**20)))
    return st.tuples(st.just(key), st.one_of(kind, kind, kind, VALUES))
NODES = {None: [{"CPU": 2.0, "memory": 4e9, "node:127.0.0.1": 1.0}],  # embedded: this machine
         "head:6379": [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "node_a": 4.0, "slot": 2.0}]}


@pytest.fixture
def fake_ray(monkeypatch):
    """Ray's view of a cluster without starting Ray: validation only asks it for its nodes."""
    import ray

    from distrl.runtime import ray_setup

    address = {"now": None}
    monkeypatch.setattr(ray_setup, "init_ray", lambda addr, user_modules=None: address.update(now=addr))
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": r} for r in NODES[address["now"]]])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(mode="async", address=None, items=[("fault.role_timeout_s", 1e18)])
@example(mode="sync", address="head:6379", items=[("fault.worker_timeout_s", 9.3e15)])
@example(mode="async", address=None, items=[("async.window_s", 1e18)])
@example(mode="sync", address="head:6379", items=[("placement.learner", {"GPU": 1, "node_a": 1})])
@example(mode="async", address="head:6379", items=[("placement.workers_strategy", "pack"), ("workers", 3)])
@example(mode="sync", address=None, items=[("placement.learner", {"\n": 1})])
@given(mode=st.sampled_from(["sync", "async"]), address=st.sampled_from(sorted(NODES, key=str)),
       items=st.lists(st.sampled_from(RAY_KEYS).flatmap(ray_item), min_size=1, max_size=2))
def test_ray_only_values_validate_or_are_one_config_error(fake_ray, mode, address, items):
    from distrl.checks import validate
    from distrl.config import ConfigError, load_config

    overrides = [f"mode={mode}", "device=cpu", *(f"{key}={yaml_text(value)}" for key, value in items)]
    try:
        cfg = load_config(CARTPOLE, overrides)
        validate(cfg, address)
    except ConfigError as e:
        assert str(e) and "\n" not in str(e), str(e)
        return
    # What validates reaches Ray's waits, which take int64 milliseconds.
    for seconds in (cfg.fault.worker_timeout_s, cfg.fault.role_timeout_s, cfg.async_.window_s):
        assert 0 <= seconds * 1000 < 2**62
