"""`--device cuda`: the learner on a GPU, workers and the evaluator on CPU, weights published as CPU numpy.
Skipped where there is no CUDA device."""
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
