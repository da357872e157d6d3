"""SAC's pieces against values worked out by hand on tiny inputs."""
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from distrl.algos.common import BoxScaler as ActionScaler
from distrl.algos.sac import SAC, Actor, critic_target, log_std_from_tanh, squashed_sample, temperature_loss
from distrl.config import config_class
from distrl.core import EnvSpec, Trajectory
from distrl.models.numpy_run import ATOL, RTOL
from distrl.roles.learning import update_once
from tests.algos.same_network import check_acts_with_the_learners_network

PENDULUM = EnvSpec(gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
                   gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
ASYM = EnvSpec(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
               gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([3.0, 10.0], np.float32)))


def _algo(spec=PENDULUM, **sac):
    cfg = config_class("sac")()
    cfg.model.hidden = [16, 16]
    for k, v in sac.items():
        setattr(cfg.sac, k, v)
    return SAC(spec, cfg.sac, cfg.model, cfg.seed)


def _batch(spec, n=32, seed=0, discounts=0.99):
    rng = np.random.default_rng(seed)
    od, ad = spec.observation_space.shape[0], spec.action_space.shape[0]
    return {"obs": rng.standard_normal((n, od)).astype(np.float32),
            "actions": rng.uniform(-1, 1, (n, ad)).astype(np.float32),
            "rewards": rng.standard_normal(n).astype(np.float32),
            "next_obs": rng.standard_normal((n, od)).astype(np.float32),
            "discounts": np.full(n, discounts, np.float32),
            "weights": np.ones(n, np.float32),
            "version": np.zeros(n, np.int32)}


# --- squashed Gaussian log-prob ---------------------------------------------------
@pytest.mark.parametrize("u", [-1.2, 0.0, 0.7, 3.0, 20.0, -20.0])
def test_tanh_log_prob_matches_hand_formula(u):
    mu, sigma = 0.3, 0.5
    noise = (u - mu) / sigma
    a, logp = squashed_sample(torch.tensor([[mu]], dtype=torch.float64),
                              torch.tensor([[math.log(sigma)]], dtype=torch.float64),
                              torch.tensor([[noise]], dtype=torch.float64))
    log_n = -0.5 * ((u - mu) / sigma) ** 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)
    # 1 - tanh(u)^2 = 1 / cosh(u)^2; the cosh form stays exact in float64 at |u| = 20.
    log_jac = -2.0 * math.log(math.cosh(u))
    if abs(u) < 5:
        assert log_jac == pytest.approx(math.log(1 - math.tanh(u) ** 2), rel=1e-9)
    assert a.item() == pytest.approx(math.tanh(u))
    assert logp.item() == pytest.approx(log_n - log_jac, rel=1e-9, abs=1e-9)


def test_log_prob_finite_in_float32_and_sums_over_dims():
    # float32 tanh(20) rounds to exactly 1: the naive log(1 - tanh^2) would be -inf.
    mean = torch.zeros(1, 2)
    log_std = torch.zeros(1, 2)
    noise = torch.tensor([[20.0, -0.5]])
    _, logp = squashed_sample(mean, log_std, noise)
    assert torch.isfinite(logp).all()
    expected = sum(-0.5 * x * x - 0.5 * math.log(2 * math.pi) + 2 * math.log(math.cosh(x))
                   for x in (20.0, -0.5))
    assert logp.item() == pytest.approx(expected, rel=1e-5)


# --- critic target ------------------------------------------------------------------
def test_critic_target_terminated_is_reward_exactly():
    r = torch.tensor([1.5, -2.25])
    y = critic_target(r, torch.zeros(2), torch.tensor([100.0, -7.0]), torch.tensor([3.0, -1.0]), 0.2)
    assert torch.equal(y, r)


def test_critic_target_truncated_bootstraps():
    gamma, k = 0.99, 3
    r, q_min, logp, alpha = 1.0, 5.0, -0.5, 0.2
    y = critic_target(torch.tensor([r]), torch.tensor([gamma ** k]), torch.tensor([q_min]),
                      torch.tensor([logp]), alpha)
    assert y.item() == pytest.approx(r + gamma ** k * (q_min - alpha * logp), rel=1e-6)


def test_learner_uses_discount_zero_as_terminal():
    learner = _algo().make_learner("cpu")
    batch = _batch(PENDULUM, discounts=0.0)
    with torch.no_grad():
        q = learner.critic(torch.as_tensor(batch["obs"]), torch.as_tensor(batch["actions"]))
    expected = (q - torch.as_tensor(batch["rewards"])).abs().mean(0).numpy()
    out = update_once(learner, batch)
    np.testing.assert_allclose(out["priorities"], expected, rtol=1e-5, atol=1e-6)


# --- temperature ----------------------------------------------------------------------
@pytest.mark.parametrize("log_pi, grows", [([2.0, 1.0], True), ([-3.0, -1.0], False)])
def test_temperature_loss_gradient_and_direction(log_pi, grows):
    target_entropy = -1.0
    log_alpha = torch.tensor(0.0, requires_grad=True)
    lp = torch.tensor(log_pi)
    loss = temperature_loss(log_alpha, lp, target_entropy)
    loss.backward()
    # d/d log_alpha of -log_alpha * (mean log_pi + H) = -(mean log_pi + H) = entropy - H.
    entropy = -float(np.mean(log_pi))
    assert log_alpha.grad.item() == pytest.approx(entropy - target_entropy)
    assert (entropy < target_entropy) == grows
    opt = torch.optim.Adam([log_alpha], lr=0.1)
    opt.step()
    assert (log_alpha.item() > 0.0) == grows


@pytest.mark.parametrize("target_entropy, grows", [(50.0, True), (-50.0, False)])
def test_learner_alpha_moves_towards_target_entropy(target_entropy, grows):
    learner = _algo(target_entropy=target_entropy, alpha_lr=0.01).make_learner("cpu")
    out = update_once(learner, _batch(PENDULUM))
    assert out["alpha"] == pytest.approx(1.0)  # the alpha used in this update
    assert (learner.log_alpha.exp().item() > 1.0) == grows


def test_alpha_fixed_without_autotune():
    learner = _algo(autotune_alpha=False, init_alpha=0.3).make_learner("cpu")
    for _ in range(3):
        out = update_once(learner, _batch(PENDULUM))
    assert out["alpha"] == pytest.approx(0.3)
    assert learner.log_alpha.exp().item() == pytest.approx(0.3)


def test_default_target_entropy_is_minus_action_dim():
    assert _algo(ASYM).make_learner("cpu").target_entropy == -2.0


# --- actions ------------------------------------------------------------------------
def test_action_scaling_round_trip_asymmetric_box():
    scaler = ActionScaler(ASYM.action_space)
    unit = np.array([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0], [0.5, -0.25]], np.float32)
    env_a = scaler.to_env(unit)
    np.testing.assert_allclose(env_a, [[-1, 0], [3, 10], [1, 5], [2, 3.75]], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(scaler.to_unit(env_a), unit)


def test_policy_actions_in_bounds_and_postprocess_normalises():
    spec = ASYM
    algo = _algo(spec, random_steps=32, n_step=2)
    policy = algo.make_policy(0, 2, 0)  # random for the first 32 / 2 = 16 env steps
    policy.set_weights(algo.make_learner("cpu").get_weights(), 0)
    rng = np.random.default_rng(1)
    T, E = 4, 3
    obs = rng.standard_normal((T, E, 4)).astype(np.float32)
    low, high = spec.action_space.low, spec.action_space.high
    for steps in (0, 16):  # random phase, then the policy's own samples
        policy.observe_steps(steps)
        actions = np.stack([policy.act(o, explore=True)[0] for o in obs])
        assert actions.shape == (T, E, 2) and actions.dtype == np.float32
        assert np.all(actions >= low) and np.all(actions <= high)
        traj = Trajectory(obs, actions, np.ones((T, E), np.float32), np.zeros((T, E), bool),
                          np.zeros((T, E), bool), obs + 1, {})
        items, prios = policy.postprocess(traj)
        assert prios is None
        assert set(items) == {"obs", "actions", "rewards", "next_obs", "discounts"}
        assert all(items[k].dtype == np.float32 for k in ("obs", "actions", "next_obs"))
        unit = items["actions"]
        assert np.all(np.abs(unit) <= 1.0)
        np.testing.assert_allclose(low + (unit + 1) * (high - low) / 2, actions.reshape(-1, 2), atol=1e-5)


def test_greedy_actions_deterministic_and_evaluator_never_random():
    algo = _algo(random_steps=10_000)
    learner = algo.make_learner("cpu")
    weights = learner.get_weights()
    evaluator = algo.make_policy(-1, 1, 0)
    evaluator.set_weights(weights, 0)
    obs = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    a1, _ = evaluator.act(obs, explore=False)
    a2, _ = evaluator.act(obs, explore=False)
    np.testing.assert_array_equal(a1, a2)
    with torch.no_grad():
        mean, _ = learner.actor(torch.as_tensor(obs))
    np.testing.assert_allclose(a1, 2.0 * np.tanh(mean.numpy()), rtol=RTOL, atol=ATOL)


def test_the_policy_acts_with_the_learners_actor():
    algo = _algo(ASYM)
    policy = algo.make_policy(0, 1, 0)
    learner = algo.make_learner("cpu")
    with torch.no_grad():
        for p in learner.actor.parameters():
            p.add_(torch.randn_like(p))  # log-stds away from the middle of their range
    obs = np.random.default_rng(3).standard_normal((9, 4)).astype(np.float32)
    check_acts_with_the_learners_network(policy, learner.actor, learner.get_weights(), "forward", obs)
    assert isinstance(policy.net, Actor)
    out, state = policy.forward(obs, None)
    with torch.no_grad():
        ref_mean, ref_log_std = learner.actor(torch.as_tensor(obs))
    assert state is None
    # Acting runs the network's numpy program: torch's values within float32 rounding.
    np.testing.assert_allclose(out["mean"], ref_mean.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out["log_std"], ref_log_std.numpy(), rtol=RTOL, atol=ATOL)
    assert out["log_std"].min() >= -5.0 and out["log_std"].max() <= 2.0


def test_log_std_maps_tanh_onto_its_range_linearly():
    t = torch.tensor([-1.0, 0.0, 1.0, 0.5])
    np.testing.assert_allclose(log_std_from_tanh(t).numpy(), [-5.0, -1.5, 2.0, 0.25])


def test_check_spec():
    assert SAC.check_spec(PENDULUM) is None
    assert SAC.check_spec(ASYM) is None
    assert "Box" in SAC.check_spec(EnvSpec(PENDULUM.observation_space, gym.spaces.Discrete(3)))
    unbounded = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    assert "finite" in SAC.check_spec(EnvSpec(PENDULUM.observation_space, unbounded))
    image = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    assert "vector observations only" in SAC.check_spec(EnvSpec(image, PENDULUM.action_space))


# --- learner --------------------------------------------------------------------------
def _snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_update_changes_nets_and_moves_targets_by_tau():
    algo = _algo(tau=0.05)
    learner = algo.make_learner("cpu")
    actor0, critic0, target0 = (_snapshot(m) for m in (learner.actor, learner.critic, learner.critic_target))
    for k in critic0:  # targets start equal to the critics
        assert torch.equal(critic0[k], target0[k])
    out = update_once(learner, _batch(PENDULUM))
    for key in ("loss", "loss_critic", "loss_actor", "loss_alpha", "alpha", "entropy", "q_mean"):
        assert isinstance(out[key], float) and math.isfinite(out[key]), key
    assert out["loss"] == out["loss_critic"]
    assert out["priorities"].shape == (32,) and np.all(np.isfinite(out["priorities"]))
    assert learner.updates == 1
    actor1, critic1, target1 = (_snapshot(m) for m in (learner.actor, learner.critic, learner.critic_target))
    assert all(not torch.equal(actor0[k], actor1[k]) for k in actor0)
    assert all(not torch.equal(critic0[k], critic1[k]) for k in critic0)
    for k in target0:
        torch.testing.assert_close(target1[k], target0[k] + 0.05 * (critic1[k] - target0[k]))


def test_zero_importance_weights_leave_critics_unchanged():
    learner = _algo().make_learner("cpu")
    critic0 = _snapshot(learner.critic)
    batch = _batch(PENDULUM)
    batch["weights"][:] = 0.0
    out = update_once(learner, batch)
    assert out["loss_critic"] == 0.0
    for k, v in _snapshot(learner.critic).items():
        torch.testing.assert_close(v, critic0[k])


def test_state_dict_round_trip_resumes_identically():
    algo = _algo()
    a = algo.make_learner("cpu")
    for i in range(3):
        update_once(a, _batch(PENDULUM, seed=i))
    b = algo.make_learner("cpu")
    b.load_state_dict(a.state_dict())
    assert b.updates == 3
    torch.manual_seed(7)
    out_a = update_once(a, _batch(PENDULUM, seed=9))
    torch.manual_seed(7)
    out_b = update_once(b, _batch(PENDULUM, seed=9))
    for key in ("loss_critic", "loss_actor", "alpha", "entropy"):
        assert out_a[key] == out_b[key]
    for k, v in a.get_weights().items():
        np.testing.assert_array_equal(v, b.get_weights()[k])


def test_get_weights_is_actor_only_and_loads_into_policy():
    algo = _algo()
    weights = algo.make_learner("cpu").get_weights()
    assert all(isinstance(v, np.ndarray) for v in weights.values())
    assert all(k.startswith(("torso", "head")) for k in weights)
    policy = algo.make_policy(0, 1, 0)
    policy.set_weights(weights, 5)
    assert policy.version == 5


DICT_PENDULUM = EnvSpec(gym.spaces.Dict({"angle": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                                         "velocity": gym.spaces.Box(-8.0, 8.0, (1,), np.float32)}),
                        PENDULUM.action_space)


def test_a_dict_of_vector_leaves_learns_as_their_concatenation_does():
    """Dict{angle, velocity}: the actor's multi-input torso and the critics' one vector of the leaves (in
    key order: Pendulum's own vector) give, from the same parameters and noise, the update of the flat
    observation."""
    flat, structured = _algo().make_learner("cpu"), _algo(DICT_PENDULUM).make_learner("cpu")
    for a, b in ((flat.actor, structured.actor), (flat.critic, structured.critic),
                 (flat.critic_target, structured.critic_target)):
        pa, pb = list(a.parameters()), list(b.parameters())
        assert [p.shape for p in pa] == [p.shape for p in pb]
        with torch.no_grad():
            for x, y in zip(pa, pb):
                y.copy_(x)
    batch = _batch(PENDULUM)
    split = {**batch, **{k: {"angle": batch[k][:, :2], "velocity": batch[k][:, 2:]} for k in ("obs", "next_obs")}}
    torch.manual_seed(4)
    want = update_once(flat, batch)
    torch.manual_seed(4)
    got = update_once(structured, split)
    for key in ("loss_critic", "loss_actor", "loss_alpha", "q_mean", "entropy"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    for x, y in zip(flat.actor.parameters(), structured.actor.parameters()):
        torch.testing.assert_close(x, y)


def test_a_structured_observation_with_an_image_leaf_is_refused_naming_it():
    spec = EnvSpec(gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                                    "camera": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)}), PENDULUM.action_space)
    assert "vector observations only (no image torsos), the env's leaf 'camera' is Box(0, 255, (8, 8, 3)" in \
        SAC.check_spec(spec)
    assert SAC.check_spec(DICT_PENDULUM) is None
