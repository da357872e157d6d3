import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from distrl.algos.common import BoxScaler as BoxMap
from distrl.algos.actor_critic import ActorCriticAlgorithm, ActorCriticNet, Categorical, DiagGaussian, actor_critic_loss
from distrl.algos.actor_critic_acting import categorical_act, gaussian_act
from distrl.algos.ppo import PPO
from distrl.config import load_config
from distrl.core import EnvSpec, Trajectory
from distrl.envs import env_spec
from distrl.models.numpy_run import ATOL, RTOL
from distrl.roles.factory import make_algorithm
from tests.algos.same_network import check_acts_with_the_learners_network


def make_algo(env_id, **over):
    overrides = ["algo=ppo", "model.hidden=[16, 16]"] + [f"ppo.{k}={v}" for k, v in over.items()]
    return make_algorithm(load_config(None, overrides), env_spec(env_id))


def make_policy(env_id, worker=0, **over):
    """A policy acting with a fresh learner's weights, and that learner's network (the reference)."""
    algo = make_algo(env_id, **over)
    learner = algo.make_learner("cpu")
    policy = algo.make_policy(worker, 1, 1000 + worker)
    policy.set_weights(learner.get_weights(), 0)
    return policy, learner.net


def test_categorical_log_prob_and_entropy_by_hand():
    logits = np.array([[0.3, -1.2, 2.0], [0.0, 0.0, 0.0]], np.float32)
    actions = np.array([2, 1])
    dist = Categorical(torch.as_tensor(logits))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_allclose(dist.log_prob(torch.as_tensor(actions)).numpy(),
                               np.log(p[np.arange(2), actions]), rtol=1e-6)
    np.testing.assert_allclose(dist.entropy().numpy(), -(p * np.log(p)).sum(1), rtol=1e-6)
    assert dist.entropy()[1].item() == pytest.approx(math.log(3))
    greedy, logp = categorical_act(logits, None)
    np.testing.assert_array_equal(greedy[:1], [2])
    np.testing.assert_allclose(logp[:1], np.log(p[0, 2]), rtol=1e-6)
    ref = torch.distributions.Categorical(logits=torch.as_tensor(logits))
    np.testing.assert_allclose(dist.entropy().numpy(), ref.entropy().numpy(), rtol=1e-6)


def test_diag_gaussian_log_prob_and_entropy_by_hand():
    mean = np.array([[0.1, -0.5], [1.0, 2.0]], np.float32)
    log_std = np.array([-0.3, 0.4], np.float32)
    a = np.array([[0.0, 0.0], [1.5, 1.0]], np.float32)
    dist = DiagGaussian(torch.as_tensor(mean), torch.as_tensor(log_std))
    std = np.exp(log_std)
    expected = (-0.5 * ((a - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)).sum(1)
    np.testing.assert_allclose(dist.log_prob(torch.as_tensor(a)).numpy(), expected, rtol=1e-5)
    ent = (0.5 + 0.5 * np.log(2 * np.pi) + log_std).sum()
    np.testing.assert_allclose(dist.entropy().numpy(), [ent, ent], rtol=1e-6)
    ref = torch.distributions.Normal(torch.as_tensor(mean), torch.as_tensor(std))
    np.testing.assert_allclose(dist.log_prob(torch.as_tensor(a)).numpy(),
                               ref.log_prob(torch.as_tensor(a)).sum(1).numpy(), rtol=1e-5)


def test_gaussian_samples_have_the_right_moments_and_log_probs():
    mean, log_std = np.full((20000, 1), 0.5, np.float32), np.array([math.log(0.2)], np.float32)
    x, logp = gaussian_act(mean, log_std, np.random.default_rng(0))
    assert abs(x.mean() - 0.5) < 0.01 and abs(x.std() - 0.2) < 0.01
    ref = DiagGaussian(torch.as_tensor(mean), torch.as_tensor(log_std)).log_prob(torch.as_tensor(x))
    np.testing.assert_allclose(logp, ref.numpy(), rtol=1e-4, atol=1e-5)
    greedy, _ = gaussian_act(mean[:3], log_std, None)
    np.testing.assert_array_equal(greedy, mean[:3])


def test_categorical_samples_follow_the_probabilities():
    logits = np.tile(np.log(np.array([[0.1, 0.6, 0.3]], np.float32)), (30000, 1))
    a, logp = categorical_act(logits, np.random.default_rng(0))
    np.testing.assert_allclose(np.bincount(a, minlength=3) / len(a), [0.1, 0.6, 0.3], atol=0.01)
    np.testing.assert_allclose(logp, np.log([0.1, 0.6, 0.3])[a], rtol=1e-5)


@pytest.mark.parametrize("env_id, shared", [("CartPole-v1", False), ("CartPole-v1", True), ("Pendulum-v1", False)])
def test_the_policy_acts_with_the_learners_network(env_id, shared):
    algo = make_algo(env_id, shared_torso=str(shared).lower())
    learner = algo.make_learner("cpu")
    with torch.no_grad():
        for p in learner.net.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    policy = algo.make_policy(0, 1, 0)
    obs = np.random.default_rng(1).normal(size=(7, *algo.spec.observation_space.shape)).astype(np.float32)
    check_acts_with_the_learners_network(policy, learner.net, learner.get_weights(), "act_outputs", obs)
    assert isinstance(policy.net, ActorCriticNet)
    # What it stores: the log-prob of the action it took (sampled in numpy) and the value, under those weights.
    a, extras = policy.act(obs, explore=True)
    stored = torch.as_tensor(extras.get("raw_action", a))
    with torch.no_grad():
        logp, _, value = learner.net.evaluate(torch.as_tensor(obs), stored)
    np.testing.assert_allclose(extras["logp"], logp.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(extras["value"], value.numpy(), rtol=RTOL, atol=ATOL)  # numpy program: float32 rounding


def test_box_map_scales_and_clips():
    m = BoxMap(gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32)))
    out = m.to_env(np.array([[-1.0, 1.0], [0.0, 0.0], [5.0, -5.0]]))
    np.testing.assert_allclose(out, [[-2.0, 1.0], [0.0, 0.5], [2.0, 0.0]])
    assert out.dtype == np.float32


def test_box_policy_greedy_is_deterministic_and_in_bounds():
    policy, net = make_policy("Pendulum-v1")
    weights = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    weights["pi_head.bias"][:] = 3.0  # push the mean far outside the bounds
    policy.set_weights(weights, 1)
    obs = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    a1, ex1 = policy.act(obs, explore=False)
    a2, _ = policy.act(obs, explore=False)
    np.testing.assert_array_equal(a1, a2)
    assert a1.shape == (6, 1) and a1.dtype == np.float32
    np.testing.assert_allclose(a1, 2.0)  # mean 3 in unit space -> 8 N·m, clipped to the bound
    assert ex1["logp"].shape == (6,) and ex1["value"].shape == (6,)


def test_box_exploration_stores_the_unclipped_sample_and_its_logp():
    policy, net = make_policy("Pendulum-v1")
    obs = np.random.default_rng(1).normal(size=(200, 3)).astype(np.float32)
    a, ex = policy.act(obs, explore=True)
    raw = ex["raw_action"]
    assert (np.abs(a) <= 2.0).all() and (np.abs(raw) > 1.0).any()  # std 1: some samples leave [-1, 1]
    np.testing.assert_allclose(a, np.clip(raw * 2.0, -2.0, 2.0), atol=1e-6)
    with torch.no_grad():
        dist, _ = net(torch.as_tensor(obs))
        np.testing.assert_allclose(ex["logp"], dist.log_prob(torch.as_tensor(raw)).numpy(), rtol=1e-5)
    T, E = 1, 200
    traj = Trajectory(obs[None], a[None], np.zeros((T, E), np.float32), np.zeros((T, E), bool),
                      np.zeros((T, E), bool), obs[None], {k: v[None] for k, v in ex.items()})
    items, prios = policy.postprocess(traj)
    assert prios is None
    np.testing.assert_array_equal(items["actions"][0], raw)
    assert set(items) == {"obs", "actions", "rewards", "terminated", "truncated", "next_obs", "logp"}


def test_discrete_policy_greedy_is_argmax_and_sampling_is_seeded():
    policy, net = make_policy("CartPole-v1")
    obs = np.random.default_rng(2).normal(size=(8, 4)).astype(np.float32)
    a, ex = policy.act(obs, explore=False)
    with torch.no_grad():
        dist, value = net(torch.as_tensor(obs))
    np.testing.assert_array_equal(a, dist.logp_all.argmax(1).numpy())
    # The same module and weights, run as its numpy program: the same floats within float32 rounding.
    np.testing.assert_allclose(ex["value"], value.numpy(), rtol=RTOL, atol=ATOL)
    s1, _ = make_policy("CartPole-v1")[0].act(obs, explore=True)
    s2, _ = make_policy("CartPole-v1")[0].act(obs, explore=True)
    np.testing.assert_array_equal(s1, s2)
    assert s1.dtype == np.int64 and set(s1) <= {0, 1}


def test_shared_torso_has_one_torso():
    shared = make_policy("CartPole-v1", shared_torso="true")[0].net
    separate = make_policy("CartPole-v1")[0].net
    assert shared.v_torso is None and separate.v_torso is not None
    assert sum(p.numel() for p in shared.parameters()) < sum(p.numel() for p in separate.parameters())


def test_actor_critic_loss_by_hand():
    cfg = load_config(None, ["algo=a2c", "a2c.vf_coef=0.5", "a2c.ent_coef=0.1", "a2c.normalize_advantages=false"]).a2c
    logp = torch.tensor([-0.5, -1.0], requires_grad=True)
    values = torch.tensor([1.0, 2.0], requires_grad=True)
    loss, terms = actor_critic_loss(logp, torch.tensor([0.7, 0.6]), values, torch.tensor([2.0, -1.0]),
                                    torch.tensor([1.5, 1.0]), cfg)
    lp = -(2.0 * -0.5 + -1.0 * -1.0) / 2
    lv = 0.5 * (0.25 + 1.0) / 2
    assert terms["loss_policy"].item() == pytest.approx(lp)
    assert terms["loss_value"].item() == pytest.approx(lv)
    assert loss.item() == pytest.approx(lp + 0.5 * lv - 0.1 * 0.65)
    loss.backward()
    np.testing.assert_allclose(logp.grad.numpy(), [-1.0, 0.5])  # -A / n


def test_check_spec():
    assert PPO.check_spec(env_spec("CartPole-v1")) is None
    assert PPO.check_spec(env_spec("Pendulum-v1")) is None
    inf_box = EnvSpec(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-np.inf, np.inf, (2,)))
    assert "finite" in PPO.check_spec(inf_box)
    # Images are the torso factory's to take (`auto`: a CNN), not refused by the algorithm.
    image = EnvSpec(gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), gym.spaces.Discrete(2))
    assert PPO.check_spec(image) is None
    net = PPO(image, load_config(None, ["algo=ppo"]).ppo, load_config(None, ["algo=ppo"]).model).build_network()
    dist, value = net(torch.zeros(5, 8, 8, 3, dtype=torch.uint8))
    assert dist.logp_all.shape == (5, 2) and value.shape == (5,)
    multi = EnvSpec(gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiDiscrete([2, 2]))
    assert ActorCriticAlgorithm.check_spec(multi) is None  # a factored categorical (test_factored_actions)
    tupled = EnvSpec(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Tuple([gym.spaces.Discrete(2)]))
    assert "Discrete, Box, MultiDiscrete or MultiBinary" in ActorCriticAlgorithm.check_spec(tupled)
