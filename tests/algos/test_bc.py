"""Behaviour cloning's loss and acting, discrete and Box."""
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from distrl.algos.sharding import local_gradient_fn
from distrl.config import load_config
from distrl.roles.factory import make_algorithm
from distrl.roles.learning import update_once


def bc(env_id: str, *extra):
    return make_algorithm(load_config(None, ["algo=bc", f"env.id={env_id}", "model.hidden=[16]", *extra]))


def test_discrete_loss_is_cross_entropy_and_a_step_raises_the_data_actions_probability():
    algo = bc("CartPole-v1")
    learner = algo.make_learner("cpu")
    rng = np.random.default_rng(0)
    batch = {"obs": rng.standard_normal((64, 4)).astype(np.float32), "actions": rng.integers(0, 2, 64)}
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        expected = F.cross_entropy(learner.net(t["obs"]), t["actions"]).item()
    out = update_once(learner, batch)
    assert out["loss"] == pytest.approx(expected, rel=1e-6) and 0.0 <= out["accuracy"] <= 1.0
    for _ in range(200):
        update_once(learner, batch)
    assert update_once(learner, batch)["loss"] < expected


def test_box_policy_acts_in_the_env_bounds_and_clones_a_constant_action():
    algo = bc("Pendulum-v1", "bc.lr=0.01")
    learner = algo.make_learner("cpu")
    obs = np.random.default_rng(1).standard_normal((32, 3)).astype(np.float32)
    target = np.full((32, 1), 0.5, np.float32)  # normalised: 0.5 of the way from the middle to the top
    for _ in range(300):
        update_once(learner, {"obs": obs, "actions": target})
    policy = algo.make_policy(-1, 1, 0)
    policy.set_weights(learner.get_weights(), 1)
    actions, _ = policy.act(obs, explore=False)
    np.testing.assert_allclose(actions, 1.0, atol=0.05)  # Pendulum's torque in [-2, 2]: 0.5 maps to 1.0


def test_a_step_over_gradient_workers_equals_the_single_learners():
    algo = bc("CartPole-v1")
    a, b = algo.make_learner("cpu"), algo.make_learner("cpu")
    b.load_state_dict(a.state_dict())
    b.use_gradient_workers(local_gradient_fn([algo.make_learner("cpu"), algo.make_learner("cpu")]), 2)
    rng = np.random.default_rng(2)
    batch = {"obs": rng.standard_normal((50, 4)).astype(np.float32), "actions": rng.integers(0, 2, 50)}
    update_once(a, batch), update_once(b, batch)
    for k, v in a.get_weights().items():
        np.testing.assert_allclose(b.get_weights()[k], v, rtol=1e-5, atol=1e-6)
