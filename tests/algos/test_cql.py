"""CQL(H): the conservative gap on top of the DQN and SAC losses, and its dataset items."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from distrl.config import load_config
from distrl.roles.factory import make_algorithm


def cql(env_id: str, *extra):
    return make_algorithm(load_config(None, ["algo=cql", f"env.id={env_id}", "model.hidden=[16]", *extra]))


def test_discrete_loss_is_the_huber_td_loss_plus_the_weighted_logsumexp_gap():
    learner = cql("CartPole-v1", "cql.conservative_weight=2.0").make_learner("cpu")
    rng = np.random.default_rng(0)
    s = {"obs": torch.as_tensor(rng.standard_normal((8, 4)).astype(np.float32)),
         "actions": torch.as_tensor(rng.integers(0, 2, 8)), "target": torch.as_tensor(rng.standard_normal(8).astype(np.float32))}
    loss, terms, _ = learner.sample_loss(s)
    with torch.no_grad():
        q = learner.q(s["obs"])
        taken = q[torch.arange(8), s["actions"]]
        huber = torch.nn.functional.huber_loss(taken, s["target"], reduction="none")
        gap = torch.logsumexp(q, 1) - taken
    assert loss.item() == pytest.approx((huber + 2.0 * gap).mean().item(), rel=1e-6)
    assert terms["cql_gap"].item() == pytest.approx(gap.mean().item(), rel=1e-6)


def test_equal_q_values_give_a_gap_of_log_the_action_count():
    learner = cql("CartPole-v1").make_learner("cpu")
    with torch.no_grad():
        for p in learner.q.parameters():
            p.zero_()
    s = {"obs": torch.zeros(4, 4), "actions": torch.tensor([0, 1, 0, 1]), "target": torch.zeros(4)}
    assert learner.sample_loss(s)[1]["cql_gap"].item() == pytest.approx(math.log(2), rel=1e-6)


def test_continuous_penalty_reaches_only_the_critics_and_raises_the_loss():
    algo = cql("Pendulum-v1", "cql.num_random=3")
    learner = algo.make_learner("cpu")
    rng = np.random.default_rng(1)
    obs = torch.as_tensor(rng.standard_normal((16, 3)).astype(np.float32))
    q = learner.critic(obs, torch.zeros(16, 1))
    penalty, stats = learner.critic_penalty(obs, obs, q)
    penalty.backward()
    assert all(p.grad is None for p in learner.actor.parameters())  # the samples carry no gradient
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in learner.critic.parameters())
    assert math.isfinite(stats["cql_gap"].item())


def test_dataset_items_are_n_step_transitions_with_normalised_box_actions():
    steps = SimpleNamespace(obs=np.arange(6, dtype=np.float32).reshape(6, 1).repeat(3, 1),
                            actions=np.array([[2.0], [-2.0], [0.0], [1.0], [2.0], [0.0]], np.float32),
                            rewards=np.ones(6, np.float32), next_obs=np.arange(1, 7, dtype=np.float32).reshape(6, 1).repeat(3, 1),
                            terminated=np.zeros(6, bool), truncated=np.array([0, 0, 1, 0, 0, 0], bool),
                            episode_ends=np.array([3, 6]))
    items = cql("Pendulum-v1", "cql.n_step=2", "cql.gamma=0.5").dataset_items(steps)
    np.testing.assert_allclose(items["actions"][:, 0], [1.0, -1.0, 0.0, 0.5, 1.0, 0.0])
    np.testing.assert_allclose(items["rewards"], [1.5, 1.5, 1.0, 1.5, 1.5, 1.0])  # windows stop at episode ends
    np.testing.assert_allclose(items["next_obs"][:, 0], [2, 3, 3, 5, 6, 6])
    np.testing.assert_allclose(items["discounts"], [0.25, 0.25, 0.5, 0.25, 0.25, 0.5])  # the unmarked last end bootstraps
