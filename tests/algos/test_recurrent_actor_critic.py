"""A recurrent core in PPO, A2C, A3C and IMPALA: what a fragment stores, how the learner cuts and unrolls it."""
import math

import numpy as np
import pytest
import torch

from distrl.algos.a2c import a2c_loss
from distrl.algos.actor_critic import episode_starts, estimates, sample_rows, time_major
from distrl.checks import validate
from distrl.config import ConfigError, load_config
from distrl.envs import VectorEnv, env_spec
from distrl.roles.factory import make_algorithm
from distrl.roles.learning import update_once
from distrl.roles.rollout import Rollout

ENV = "CartPole-v1"  # random actions end its episodes within a fragment or two: resets inside fragments
T, E, L = 16, 4, 4


def make(algo, core="lstm", *overrides, env=ENV):
    cfg = load_config(None, [f"algo={algo}", "model.hidden=[16]", f"model.core={core}", "model.core_size=8",
                             f"rollout.fragment_length={T}", f"rollout.recurrence={L}", *overrides])
    return make_algorithm(cfg, env_spec(env))


def rollout(algo, learner, fragments=2, kwargs=None):
    """The last of `fragments` fragments from one Rollout (so its first state is mid-episode for some envs)."""
    policy = algo.make_policy(0, 1, 1000)
    policy.set_weights(learner.get_weights(), learner.updates)
    worker = Rollout(policy, VectorEnv(ENV, E, 0, kwargs or {"max_episode_steps": 10}), T, 0)
    for _ in range(fragments):
        data = worker.sample().data
    return data, policy, worker


CASES = [("ppo", "lstm"), ("impala", "gru"), ("a2c", "gru"), ("a3c", "lstm")]


@pytest.mark.parametrize("name,core", [c for c in CASES if c[0] != "a3c"])
def test_the_learner_unrolls_a_fragment_from_its_stored_state_as_the_worker_acted(name, core):
    algo = make(name, core)
    learner = algo.make_learner("cpu")
    data, policy, _ = rollout(algo, learner)
    S = 2 if core == "lstm" else 1
    assert data["state"].shape == (1, E, S, 8) and data["final_value"].shape == (T, E)
    assert np.abs(data["state"]).sum() > 0  # the second fragment starts mid-episode
    t = time_major(data, "cpu")
    first = episode_starts(t)
    assert first.any() and not first[0].any()  # episodes start inside the fragment
    # With the worker's weights, the learner's log-probs of the stored actions are the worker's: the stored
    # state and the episode resets reproduce the worker's states step by step.
    est = estimates(learner.net, t, L)
    np.testing.assert_allclose(est.logp.numpy(), data["logp"], atol=2e-5)
    whole = estimates(learner.net, t, None)  # one piece of T steps: the same forward pass
    np.testing.assert_allclose(whole.values.numpy(), est.values.numpy(), atol=1e-5)
    assert est.starts.shape == (T // L, E, S, 8) and whole.starts.shape == (1, E, S, 8)
    # Rows: sequences of L steps, sequence k * E + e holding env e's steps [k L, (k + 1) L) and its start state.
    rows = sample_rows(t, est, L, adv=est.values)
    assert rows["obs"].shape == (T // L * E, L, 4) and rows["first"].shape == (T // L * E, L)
    k, e = 2, 3
    np.testing.assert_array_equal(rows["obs"][k * E + e].numpy(), data["obs"][k * L:(k + 1) * L, e])
    np.testing.assert_array_equal(rows["state"][k * E + e].numpy(), est.starts[k, e].numpy())
    with torch.no_grad():  # each sequence unrolled alone from its start gives the whole fragment's numbers
        logp, _, values = learner.net.evaluate(rows["obs"], rows["actions"], rows["state"], rows["first"])
    np.testing.assert_allclose(values.numpy(), rows["adv"].numpy(), atol=1e-5)
    np.testing.assert_allclose(logp.numpy()[k * E + e], data["logp"][k * L:(k + 1) * L, e], atol=2e-5)


def test_a_truncated_episode_bootstraps_from_the_state_after_its_last_step():
    algo = make("ppo", "lstm")
    learner = algo.make_learner("cpu")
    data, _, _ = rollout(algo, learner, kwargs={"max_episode_steps": 5})  # truncated before a pole falls
    t = time_major(data, "cpu")
    ts, es = np.nonzero(data["truncated"] & ~data["terminated"])
    assert len(ts) >= E
    est = estimates(learner.net, t, L)
    np.testing.assert_allclose(est.next_values.numpy()[ts, es], data["final_value"][ts, es], atol=1e-6)
    assert np.abs(data["final_value"]).sum() > 0 and (data["final_value"][~data["truncated"]] == 0).all()
    for step, env in zip(ts, es):  # the episode's steps from the fragment's start, then its next observation
        obs, start = t["obs"][:step + 1, env:env + 1], t["state"][0, env:env + 1]
        with torch.no_grad():
            _, _, after = learner.net.unroll(obs, start, episode_starts(t)[:step + 1, env:env + 1])
            _, value, _ = learner.net.unroll(t["next_obs"][step:step + 1, env:env + 1], after)
        assert value.item() == pytest.approx(float(data["final_value"][step, env]), abs=1e-5)
    # Where the episode goes on, the next step's value under the unroll is the bootstrap.
    going_on = ~(data["terminated"] | data["truncated"])[:-1]
    np.testing.assert_array_equal(est.next_values.numpy()[:-1][going_on], est.values.numpy()[1:][going_on])


@pytest.mark.parametrize("name,core", CASES)
def test_one_update_on_sequences_of_a_real_rollout(name, core):
    algo = make(name, core, "ppo.minibatches=32" if name == "ppo" else "seed=0")  # more minibatches than rows
    learner = algo.make_learner("cpu")
    before = {k: v.copy() for k, v in learner.get_weights().items()}
    data, _, _ = rollout(algo, learner)
    out = update_once(learner, data)
    assert learner.updates == 1 and all(math.isfinite(out[k]) for k in ("loss", "loss_policy", "entropy"))
    assert 0.0 < out["sequences_cut"] < 1.0  # episodes of 10 steps start inside some of the 16 sequences
    assert any(not np.array_equal(before[k], v) for k, v in learner.get_weights().items())
    assert any(k.startswith("core.") for k in before)  # the core is trained and published


def test_the_a3c_workers_gradient_is_the_recurrent_a2c_gradient():
    algo = make("a3c", "gru")
    learner = algo.make_learner("cpu")
    msg, _, _ = rollout(algo, learner)
    plain = make("a2c", "gru")
    items, _, _ = rollout(plain, learner)  # the same envs, seeds and weights: the same fragment
    loss, terms = a2c_loss(learner.net, time_major(items, "cpu"), plain.cfg, L)
    loss.backward()
    for name, p in learner.net.named_parameters():
        np.testing.assert_allclose(msg[f"grad/{name}"], p.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert msg["sequences_cut"][0] == pytest.approx(terms["sequences_cut"].item())


def test_a_restored_worker_starts_every_episode_from_a_fresh_state():
    # Env internals are not in a checkpoint: a restored worker restarts its episodes, and their states with them.
    algo = make("ppo", "lstm")
    learner = algo.make_learner("cpu")
    _, _, worker = rollout(algo, learner)
    worker.set_state(worker.get_state())
    data = worker.sample().data
    assert (data["state"] == 0).all()


@pytest.mark.parametrize("overrides, message", [
    (["rollout.recurrence=5"], r"^config key 'rollout.recurrence': 5 does not divide rollout.fragment_length 16 "),
    (["model.core=none"], r"^config key 'rollout.recurrence': it cuts fragments into trained sequences for an "
                          r"on-policy learner with a model.core; this ppo run has none"),
])
def test_bad_recurrent_settings_are_one_line(overrides, message):
    cfg = load_config(None, ["algo=ppo", "env.id=CartPole-v1", "model.core=lstm", "rollout.fragment_length=16",
                             "rollout.recurrence=8", *overrides])
    with pytest.raises(ConfigError, match=message):
        validate(cfg)
