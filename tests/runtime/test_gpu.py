"""`--device cuda`: the learner and a central inference server on a GPU, workers and the evaluator on CPU,
weights published as CPU numpy. Skipped where there is no CUDA device."""
import os

import numpy as np
import pytest
import torch

from distrl import train
from distrl.checkpoint import load_weights
from distrl.config import load_config
from distrl.roles.factory import make_algorithm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
BREAKOUT = os.path.join(ROOT, "configs", "apex_dqn_minatar_breakout.yaml")
QUIET = ["log.progress=false", "log.tensorboard=false", "eval.target_return=null"]


def test_a_learner_on_the_gpu_publishes_cpu_numpy_weights():
    algo = make_algorithm(load_config(CARTPOLE))
    learner = algo.make_learner("cuda")
    assert next(learner.q.parameters()).is_cuda
    weights = learner.get_weights()
    assert weights and all(isinstance(w, np.ndarray) for w in weights.values())


@pytest.mark.parametrize("mode", ["single", "sync"])
def test_a_run_with_the_learner_on_the_gpu(ray_session, tmp_path, mode):
    run_dir = str(tmp_path / mode)
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[f"mode={mode}", "device=cuda", "workers=1",
                                                         "stop.max_env_steps=6000", *QUIET])
    assert summary["updates"] > 0 and summary["stop_reason"] == "max_env_steps"
    weights, _ = load_weights(os.path.join(run_dir, "checkpoints", "best.safetensors"))
    assert all(isinstance(w, np.ndarray) and np.isfinite(w).all() for w in weights.values())


def test_a_policy_on_the_gpu_gives_the_cpu_policys_outputs():
    algo = make_algorithm(load_config(BREAKOUT))
    weights = algo.make_learner("cpu").get_weights()
    obs = np.random.default_rng(0).integers(0, 2, (8, 10, 10, 4)).astype(bool)
    outputs = []
    for device in ("cpu", "cuda"):
        policy = algo.make_policy(-1, 1, 0)
        policy.place(device)
        policy.set_weights(weights, 0)
        out, _ = policy.forward(obs, None)
        outputs.append(out)
    assert next(policy.net.parameters()).is_cuda
    for key, value in outputs[0].items():
        assert isinstance(outputs[1][key], np.ndarray)
        np.testing.assert_allclose(outputs[1][key], value, rtol=1e-4, atol=1e-4, err_msg=key)


def test_a_run_with_central_inference_on_the_gpu(ray_session, tmp_path):
    summary = train(CARTPOLE, run_dir=str(tmp_path / "run"), overrides=[
        "mode=sync", "device=cuda", "workers=2", "rollout.inference=central", "stop.max_env_steps=6000", *QUIET])
    assert summary["updates"] > 0 and summary["stop_reason"] == "max_env_steps"
