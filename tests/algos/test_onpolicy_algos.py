import math

import numpy as np
import pytest
import torch

from distrl.algos.a2c import a2c_loss
from distrl.algos.actor_critic import actor_critic_loss, time_major
from distrl.algos.advantages import gae, vtrace
from distrl.algos.ppo import ppo_loss
from distrl.config import load_config
from distrl.envs import VectorEnv, env_spec
from distrl.roles.factory import make_algorithm
from distrl.roles.rollout import Rollout
from distrl.roles.learning import update_once

T, E = 8, 4


def make(algo, env="CartPole-v1", *overrides):
    cfg = load_config(None, [f"algo={algo}", "model.hidden=[16, 16]", *overrides])
    return make_algorithm(cfg, env_spec(env))


def rollout_batch(algo, learner, k=1, env="CartPole-v1", version=None):
    """k fragments from real Rollouts, concatenated along the env axis like the FIFO does."""
    frags = []
    for i in range(k):
        policy = algo.make_policy(i, k, 1000 + i)
        policy.set_weights(learner.get_weights(), learner.updates if version is None else version)
        frags.append(Rollout(policy, VectorEnv(env, E, 10 * i), T, i).sample().data)
    if k == 1:
        return frags[0]
    return {key: np.concatenate([f[key] for f in frags], axis=1) for key in frags[0]}


def weights_equal(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


CASES = [("a2c", "CartPole-v1"), ("a3c", "CartPole-v1"), ("ppo", "CartPole-v1"),
         ("impala", "CartPole-v1"), ("ppo", "Pendulum-v1"), ("impala", "Pendulum-v1"),
         ("a2c", "Pendulum-v1"), ("a3c", "Pendulum-v1")]


@pytest.mark.parametrize("name,env", CASES)
def test_one_update_on_a_real_rollout_and_state_round_trip(name, env):
    algo = make(name, env)
    assert algo.check_spec(algo.spec) is None
    learner = algo.make_learner("cpu")
    before = learner.get_weights()
    batch = rollout_batch(algo, learner, env=env)
    out = update_once(learner, batch)
    for key in ("loss", "loss_policy", "loss_value", "entropy"):
        assert math.isfinite(out[key]), key
    assert "priorities" not in out
    assert learner.updates == 1 and not weights_equal(before, learner.get_weights())

    other = algo.make_learner("cpu")
    other.load_state_dict(learner.state_dict())
    assert other.updates == 1 and weights_equal(learner.get_weights(), other.get_weights())
    # Optimizer state came along too: the same next update gives the same weights.
    for lrn in (learner, other):
        torch.manual_seed(5)
        update_once(lrn, batch)
    assert weights_equal(learner.get_weights(), other.get_weights())


@pytest.mark.parametrize("name", ["a2c", "ppo", "impala"])
def test_batch_of_several_fragments(name):
    algo = make(name)
    learner = algo.make_learner("cpu")
    batch = rollout_batch(algo, learner, k=2)
    assert batch["obs"].shape == (T, 2 * E, 4) and batch["version"].shape == (T, 2 * E)
    out = update_once(learner, batch)
    assert learner.updates == 1 and math.isfinite(out["loss"])


def test_ppo_counts_one_update_per_batch_and_reports_optimizer_steps():
    algo = make("ppo", "CartPole-v1", "ppo.epochs=3", "ppo.minibatches=2")
    learner = algo.make_learner("cpu")
    out = update_once(learner, rollout_batch(algo, learner))
    assert learner.updates == 1 and out["optimizer_steps"] == 6
    assert {"approx_kl", "clip_frac", "grad_norm"} <= set(out)


# --- PPO math ---------------------------------------------------------------------
def ppo_cfg(*overrides):
    return load_config(None, ["algo=ppo", "ppo.clip=0.2", "ppo.vf_coef=0.5", "ppo.ent_coef=0.0", *overrides]).ppo


def test_clipped_surrogate_by_hand():
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    logp = ratios.log().requires_grad_()
    z = torch.zeros(4)
    loss, terms = ppo_loss(logp, z, adv, z, z, z, z, ppo_cfg())
    # min(r A, clip(r) A): 1.2 (clipped), 0.5, -1.1, -0.8 (clipped)
    assert terms["loss_policy"].item() == pytest.approx(-(1.2 + 0.5 - 1.1 - 0.8) / 4)
    assert terms["clip_frac"].item() == pytest.approx(0.75)
    loss.backward()
    # d/dlogp of -r A / n = -r A / n where the unclipped term is the min; 0 where the clip binds.
    np.testing.assert_allclose(logp.grad.numpy(), [0.0, -0.5 / 4, 1.1 / 4, 0.0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("vf_clip", [None, 0.2])
def test_value_loss_with_and_without_clipping(vf_clip):
    old = torch.zeros(4)
    values = torch.tensor([1.0, -0.05, 0.3, 2.0], requires_grad=True)
    returns = torch.tensor([0.5, 1.0, 0.0, 3.0])
    cfg = ppo_cfg(f"ppo.vf_clip={'null' if vf_clip is None else vf_clip}")
    _, terms = ppo_loss(torch.zeros(4), torch.zeros(4), torch.zeros(4), values, old, returns,
                        torch.zeros(4), cfg)
    plain = np.array([0.25, 1.1025, 0.09, 1.0])
    if vf_clip is None:
        expected = plain
    else:
        clipped = np.array([0.3 ** 2, 1.05 ** 2, 0.2 ** 2, 2.8 ** 2])  # V clipped to old +- 0.2
        expected = np.maximum(plain, clipped)
    assert terms["loss_value"].item() == pytest.approx(0.5 * expected.mean(), rel=1e-5)
    terms["loss_value"].backward()
    grad = values.grad.numpy()
    # Sample 3's clipped error dominates; its V is pinned at the clip edge, so no gradient.
    assert (grad[3] == 0.0) == (vf_clip is not None)
    assert grad[0] == pytest.approx(0.5 * 2 * 0.5 / 4)


def test_ppo_uses_vtrace_targets_under_policy_lag_and_gae_without():
    algo = make("ppo")
    c = algo.cfg
    learner = algo.make_learner("cpu")
    batch = rollout_batch(algo, learner)        # version 0
    update_once(learner, rollout_batch(algo, learner))  # the learner moves on: updates = 1
    t = time_major(batch, "cpu")
    shape = t["rewards"].shape
    with torch.no_grad():
        logp, _, values = learner.net.evaluate(flat(t["obs"]), flat(t["actions"]))
        values, nv = values.view(shape), learner.net.value(flat(t["next_obs"])).view(shape)
    args = (t["rewards"], values, nv, t["terminated"], t["truncated"], c.gamma)
    ref_vs, _ = vtrace(t["logp"], logp.view(shape), *args, c.rho_bar, c.c_bar, c.gae_lambda)
    adv, ret, v, lag = learner.targets(t)
    assert lag == 1.0
    np.testing.assert_allclose(ret.numpy(), ref_vs.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv.numpy(), (ref_vs - values).numpy(), rtol=1e-5, atol=1e-5)
    gae_adv, gae_ret = gae(*args, c.gae_lambda)
    assert not np.allclose(ret.numpy(), gae_ret.numpy(), atol=1e-6)  # the correction mattered

    t["version"] = torch.full(shape, 1, dtype=torch.int32)  # fresh data: plain GAE
    adv, ret, _, lag = learner.targets(t)
    assert lag == 0.0
    np.testing.assert_allclose(adv.numpy(), gae_adv.numpy(), rtol=1e-6, atol=1e-6)


def flat(x: torch.Tensor) -> torch.Tensor:  # time-major (T, E, ...) -> rows (T * E, ...)
    return x.reshape(-1, *x.shape[2:])


# --- IMPALA -----------------------------------------------------------------------
def test_impala_loss_uses_vtrace_with_learner_log_probs():
    algo = make("impala", "CartPole-v1", "impala.rho_bar=0.9", "impala.c_bar=0.8")
    c = algo.cfg
    learner = algo.make_learner("cpu")
    batch = rollout_batch(algo, learner)
    update_once(learner, rollout_batch(algo, learner))  # makes the batch off-policy
    t = time_major(batch, "cpu")
    shape = t["rewards"].shape
    with torch.no_grad():
        logp, ent, values = learner.net.evaluate(flat(t["obs"]), flat(t["actions"]))
        nv = learner.net.value(flat(t["next_obs"])).view(shape)
        vs, pg = vtrace(t["logp"], logp.view(shape), t["rewards"], values.view(shape), nv,
                        t["terminated"], t["truncated"], c.gamma, c.rho_bar, c.c_bar)
        expected, terms = actor_critic_loss(logp, ent, values, pg.reshape(-1), vs.reshape(-1), c)
    out = update_once(learner, batch)
    assert out["loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert out["loss_value"] == pytest.approx(terms["loss_value"].item(), rel=1e-5)
    assert out["rho_mean"] != pytest.approx(1.0, abs=1e-7)


# --- A3C --------------------------------------------------------------------------
def grad_message(learner, grads, version):
    msg = {f"grad/{n}": g.astype(np.float32) for n, g in grads.items()}
    msg.update(steps=np.array([T * E]), version=np.array([version], np.int32),
               loss_policy=np.array([0.1], np.float32), loss_value=np.array([1.0], np.float32),
               entropy=np.array([0.6], np.float32))
    for v in msg.values():
        v.setflags(write=False)  # as from Ray's object store
    return msg


def test_a3c_worker_message_is_the_a2c_gradient():
    algo = make("a3c")
    learner = algo.make_learner("cpu")
    policy = algo.make_policy(0, 1, 1000)
    policy.set_weights(learner.get_weights(), 3)
    rollout = Rollout(policy, VectorEnv("CartPole-v1", E, 0), T, 0)
    msg = rollout.sample().data
    assert msg["version"].tolist() == [3] and msg["steps"].tolist() == [T * E]
    assert "rewards" not in msg and all(msg[k].shape == (1,) for k in ("loss_policy", "loss_value", "entropy"))
    # The same fragment (same seeds, same weights) from a plain policy, A2C loss differentiated here.
    plain = make("a2c").make_policy(0, 1, 1000)
    plain.set_weights(learner.get_weights(), 3)
    items = Rollout(plain, VectorEnv("CartPole-v1", E, 0), T, 0).sample().data
    loss, _ = a2c_loss(learner.net, time_major(items, "cpu"), algo.cfg)
    loss.backward()
    for name, p in learner.net.named_parameters():
        np.testing.assert_allclose(msg[f"grad/{name}"], p.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a3c_applies_in_arrival_order_and_drops_stale_gradients():
    algo = make("a3c", "CartPole-v1", "a3c.grad_clip=null", "a3c.max_staleness=1")
    learner = algo.make_learner("cpu")
    # Momentum makes the result depend on the order: p2 = p0 - lr gA - lr (m gA + gB).
    learner.opt = torch.optim.SGD(learner.net.parameters(), lr=0.1, momentum=0.9)
    p0 = learner.get_weights()
    rng = np.random.default_rng(0)
    ga = {n: rng.normal(size=v.shape) for n, v in p0.items()}
    gb = {n: rng.normal(size=v.shape) for n, v in p0.items()}
    out_a = update_once(learner, grad_message(learner, ga, 0))
    out_b = update_once(learner, grad_message(learner, gb, 0))
    assert (out_a["staleness"], out_b["staleness"]) == (0, 1)
    assert out_a["dropped"] == 0 and learner.updates == 2
    p2 = learner.get_weights()
    for n in p0:
        expected = p0[n] - 0.1 * ga[n] - 0.1 * (0.9 * ga[n] + gb[n])
        swapped = p0[n] - 0.1 * gb[n] - 0.1 * (0.9 * gb[n] + ga[n])
        np.testing.assert_allclose(p2[n], expected, rtol=1e-5, atol=1e-5)
        assert not np.allclose(p2[n], swapped, atol=1e-5)
    # Computed at version 0, arriving after 2 updates: staleness 2 > 1, dropped untouched.
    out = update_once(learner, grad_message(learner, ga, 0))
    assert out["dropped"] == 1 and out["staleness"] == 2 and learner.dropped == 1
    assert learner.updates == 2 and weights_equal(p2, learner.get_weights())
    assert math.isfinite(out["loss"])
    restored = algo.make_learner("cpu")
    restored.opt = torch.optim.SGD(restored.net.parameters(), lr=0.1, momentum=0.9)
    restored.load_state_dict(learner.state_dict())
    assert restored.dropped == 1 and restored.updates == 2


def test_a3c_rejects_concatenated_messages():
    algo = make("a3c")
    learner = algo.make_learner("cpu")
    msg = dict(grad_message(learner, {n: np.zeros_like(v) for n, v in learner.get_weights().items()}, 0))
    msg["version"] = np.array([0, 0], np.int32)
    with pytest.raises(ValueError, match="one gradient message"):
        update_once(learner, msg)

