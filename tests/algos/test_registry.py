"""The algorithm registry: policies come without the learner's module (and, but for A3C, without torch)."""
import subprocess
import sys

import numpy as np
import pytest

from distrl.registry import make_policy
from distrl.registry import ALGOS, algorithm_class as get_algorithm_class
from distrl.config import load_config
from distrl.envs import env_spec


def _env(name: str) -> str:
    return {"sac": "Pendulum-v1", "dhc": "distrl.envs.mapf:MAPF"}.get(name, "CartPole-v1")


@pytest.mark.parametrize("name", sorted(n for n in ALGOS if not ALGOS[n].multi_agent))  # dhc: tests/algos/test_dhc.py
def test_policies_act_only_after_set_weights(name):
    cfg = load_config(None, [f"algo={name}", f"{name}.hidden=[16, 16]"])
    algo = get_algorithm_class(name)(cfg, env_spec(_env(name)))
    policy = make_policy(algo.cfg, algo.spec, 0, 1)
    obs = np.zeros((2, algo.spec.observation_space.shape[0]), np.float32)
    with pytest.raises(RuntimeError, match="no weights yet: call set_weights first"):
        policy.act(obs, explore=False)
    policy.set_weights(algo.make_learner("cpu").get_weights(), 0)
    actions, _ = policy.act(obs, explore=False)
    assert len(actions) == 2


def test_acting_processes_do_not_import_torch():
    """What a rollout worker or the evaluator builds, in a fresh interpreter: torch stays unloaded."""
    names = [n for n in sorted(ALGOS) if n != "a3c"]  # A3C's workers compute gradients with torch
    code = f"""
import sys
from distrl.config import load_config
from distrl.roles.factory import acting_policy
from distrl.roles.rollout import Rollout
from distrl.roles.evaluation import Evaluation
for name, env in {[(n, _env(n)) for n in names]!r}:
    cfg = load_config(None, ["algo=" + name, "env.id=" + env])
    acting_policy(cfg, 0, 2)
    acting_policy(cfg, -1, 1)
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
