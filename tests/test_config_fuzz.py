"""Any value of any type for any config key: the run starts, or one line and exit 2 (never a traceback).

Values that validate are started for real, in single mode with a tiny budget, so a value the
checks let through but a role then chokes on is caught too.
"""
import dataclasses
import os
import typing
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distrl.cli import main
from distrl.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
TINY = ["stop.max_env_steps=512", "stop.max_seconds=30", "log.progress=false", "log.tensorboard=false",
        "eval.episodes=2", "mode=single"]
SKIP = {"mode", "algo"}  # other modes start Ray; other algorithms other envs: covered elsewhere


def keys(cls=Config, prefix=""):
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
