"""The algorithm table: every entry imports, its class declares what it is consistently, the capabilities
the runtime asks about come from those declarations, and every shipped config names a registered one."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from distrl.algos.common import ACTION_KINDS
from distrl.config import MODES, DATA_SECTIONS, config_class, load_config
from distrl.config.sections import ModelConfig, RecurrentModelConfig
from distrl.core import Algorithm, Learner, Policy
from distrl.envs import env_spec
from distrl.models.torsos import IMAGE_TORSOS
from distrl.registry import ALGORITHMS, algorithm, on_policy, with_capability
from distrl.roles.factory import make_algorithm

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
FLAGS = ("multi_agent", "central_inference", "gradient_workers")


def _env(name: str) -> str:
    return {"sac": "Pendulum-v1", "dhc": "distrl.envs.mapf:MAPF"}.get(name, "CartPole-v1")


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_entry_imports_the_class_that_declares_that_name(name):
    cls = algorithm(name)
    assert isinstance(cls, type) and issubclass(cls, Algorithm)
    assert ALGORITHMS[name] == f"{cls.__module__}:{cls.__name__}"
    assert cls.name == name
    assert algorithm(name) is cls  # cached: one class per name


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_class_declares_itself_consistently(name):
    cls = algorithm(name)
    assert dataclasses.is_dataclass(cls.config)
    assert issubclass(cls.model_config, ModelConfig)
    model_fields = {fl.name for fl in dataclasses.fields(cls.model_config)}
    assert set(cls.model_defaults) <= model_fields
    assert cls.modes and set(cls.modes) <= set(MODES)
    assert cls.actions and set(cls.actions) <= {kind for kind, _, _ in ACTION_KINDS}
    assert cls.data_path in DATA_SECTIONS
    assert all(isinstance(getattr(cls, flag), bool) for flag in FLAGS)
    assert cls.image_torso in ("auto", *IMAGE_TORSOS)
    # Recurrent state is what sequence replay stores: a core exactly when the data path is sequences.
    assert (cls.data_path == "sequence") == issubclass(cls.model_config, RecurrentModelConfig)
    # Workers that compute gradients need their own copy of the network: they cannot act centrally.
    assert not (cls.data_path == "gradients" and cls.central_inference)
    assert on_policy(name) == (cls.data_path in ("trajectory", "gradients"))
    # The run config built from the class: its section, its model defaults, its data path's sections.
    cfg = config_class(name)()
    assert cfg.algo == name and isinstance(cfg.algo_config, cls.config)
    assert isinstance(cfg.model, cls.model_config)
    assert all(getattr(cfg.model, k) == v for k, v in cls.model_defaults.items())
    assert all(hasattr(cfg, key) for key, _, _ in DATA_SECTIONS[cls.data_path])
    assert not any(hasattr(cfg, other) for other in ALGORITHMS if other != name)


def test_capabilities_come_from_the_classes():
    assert with_capability("gradient_workers") == ["apex_dqn", "ppo", "mappo", "impala", "bc", "cql"]
    assert with_capability("multi_agent") == ["dhc", "mappo"]
    assert with_capability("offline") == ["bc", "cql"]
    assert "a3c" not in with_capability("central_inference")
    for flag in FLAGS:
        assert with_capability(flag) == [n for n in ALGORITHMS if getattr(algorithm(n), flag)]
    assert [n for n in ALGORITHMS if on_policy(n)] == ["a2c", "a3c", "ppo", "mappo", "impala"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_names_a_registered_algorithm(path):
    cfg = load_config(str(path))
    cls = algorithm(cfg.algo)
    assert isinstance(cfg.algo_config, cls.config) and isinstance(cfg.model, cls.model_config)
    assert cfg.mode in cls.modes


def test_every_algorithm_has_a_shipped_config():
    assert {load_config(str(p)).algo for p in CONFIGS} == set(ALGORITHMS)


@pytest.mark.parametrize("name", sorted(n for n in ALGORITHMS if not algorithm(n).multi_agent))  # dhc: test_dhc.py
def test_policies_act_only_after_set_weights(name):
    cfg = load_config(None, [f"algo={name}", "model.hidden=[16, 16]"])
    algo = make_algorithm(cfg, env_spec(_env(name)))
    assert algo.check_spec(algo.spec) is None
    learner, policy = algo.make_learner("cpu"), algo.make_policy(0, 1, 0)
    assert isinstance(learner, Learner) and isinstance(policy, Policy)
    obs = np.zeros((2, algo.spec.observation_space.shape[0]), np.float32)
    with pytest.raises(RuntimeError, match="no weights yet: call set_weights first"):
        policy.act(obs, explore=False)
    policy.set_weights(learner.get_weights(), 0)
    actions, _ = policy.act(obs, explore=False)
    assert len(actions) == 2
