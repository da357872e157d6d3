"""SAC's hand-written numpy update (distrl/algos/sac_numpy.py) against the autograd update it replaces on CPUs."""
import numpy as np
import pytest
import torch

from distrl.algos.sac import SACLearner
from distrl.algos.sac_numpy import flush_denormals_enabled
from distrl.config import load_config
from tests.algos.test_sac import ASYM, PENDULUM, _algo, _batch

LUNAR = "configs/sac_lunarlander_continuous.yaml"


def _pair(algo):
    """Two learners with the same initial state: `fast` runs the numpy update, `ref` autograd."""
    fast = SACLearner(algo.spec, algo.cfg.sac, "cpu", use_numpy=True)
    ref = SACLearner(algo.spec, algo.cfg.sac, "cpu", use_numpy=False)
    ref.load_state_dict(fast.state_dict())
    return fast, ref


def _assert_same_learners(a, b, rtol=1e-5, atol=1e-6):
    for name in ("actor", "critic", "critic_target"):
        for k, v in getattr(a, name).state_dict().items():
            torch.testing.assert_close(v, getattr(b, name).state_dict()[k], rtol=rtol, atol=atol, msg=name + k)
    torch.testing.assert_close(a.log_alpha.detach(), b.log_alpha.detach(), rtol=rtol, atol=atol)


def _step_both(fast, ref, batch, seed):
    torch.manual_seed(seed)
    out_fast = fast.update(batch)
    torch.manual_seed(seed)
    return out_fast, ref.update(batch)


@pytest.mark.parametrize("hidden, autotune, weighted", [([16, 16], True, True), ([16, 16], False, False),
                                                        ([8], True, False), ([16, 12, 8], True, True)])
def test_numpy_update_matches_autograd_at_odd_shapes(hidden, autotune, weighted):
    fast, ref = _pair(_algo(ASYM, hidden=hidden, autotune_alpha=autotune, tau=0.1, init_alpha=0.5))
    for step in range(5):
        batch = _batch(ASYM, n=64, seed=step, discounts=0.9)
        batch["discounts"][::5] = 0.0  # some terminal transitions
        if weighted:
            batch["weights"] = np.random.default_rng(step).uniform(0.2, 2.0, 64).astype(np.float32)
        out_fast, out_ref = _step_both(fast, ref, batch, 100 + step)
        for key in ("loss", "loss_critic", "loss_actor", "loss_alpha", "alpha", "entropy", "q_mean"):
            assert out_fast[key] == pytest.approx(out_ref[key], rel=1e-4, abs=1e-5), key
        np.testing.assert_allclose(out_fast["priorities"], out_ref["priorities"], rtol=1e-4, atol=1e-6)
    _assert_same_learners(fast, ref)
    if not autotune:
        assert fast.log_alpha.item() == pytest.approx(np.log(0.5))


def _lunar_batch(rng, n, step):
    return {"obs": rng.normal(size=(n, 8)).astype(np.float32), "next_obs": rng.normal(size=(n, 8)).astype(np.float32),
            "actions": rng.uniform(-1, 1, (n, 2)).astype(np.float32),
            "rewards": rng.normal(size=n).astype(np.float32) + np.float32(step % 7 - 3),
            "discounts": np.where(rng.random(n) < 0.02, 0.0, 0.99).astype(np.float32)}


def test_numpy_update_tracks_autograd_at_the_shipped_size_over_many_updates():
    """The LunarLanderContinuous config (8 obs, 2 actions, 64x64, batch 256, its learning rates), 300 updates.

    Two checks. Every 25 updates, one update from the numpy learner's current state by both paths
    must agree to float precision (states met late in training: dead units, large activations).
    And the two paths trained side by side must stay the same function: equal losses, Q-values and
    actions (single weights may differ by a few learning rates, since Adam turns a near-zero
    gradient's rounding into a full-size step of either sign)."""
    from distrl.algos.sac import SAC
    from distrl.envs import env_spec

    cfg = load_config(LUNAR)
    algo = SAC(cfg, env_spec(cfg.env.id, cfg.env.kwargs))
    assert cfg.sac.hidden == [64, 64] and cfg.learner.batch_size == 256
    fast, ref = _pair(algo)
    probe = SACLearner(algo.spec, cfg.sac, "cpu", use_numpy=False)
    rng = np.random.default_rng(0)
    worst = {}
    for step in range(300):
        batch = _lunar_batch(rng, cfg.learner.batch_size, step)
        if step % 25 == 24:
            probe.load_state_dict(fast.state_dict())
            after = SACLearner(algo.spec, cfg.sac, "cpu", use_numpy=True)
            after.load_state_dict(fast.state_dict())
            _step_both(after, probe, batch, 10_000 + step)
            _assert_same_learners(after, probe, rtol=1e-4, atol=1e-5)
        out_fast, out_ref = _step_both(fast, ref, batch, step)
        for key in ("loss_critic", "loss_actor", "alpha", "entropy", "q_mean"):
            rel = abs(out_fast[key] - out_ref[key]) / max(abs(out_ref[key]), 1e-3)
            worst[key] = max(worst.get(key, 0.0), rel)
    assert fast.updates == ref.updates == 300
    assert all(v < 1e-3 for v in worst.values()), worst
    obs = torch.as_tensor(rng.normal(size=(512, 8)).astype(np.float32))
    acts = torch.as_tensor(rng.uniform(-1, 1, (512, 2)).astype(np.float32))
    with torch.no_grad():
        torch.testing.assert_close(fast.actor(obs)[0], ref.actor(obs)[0], rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(fast.critic(obs, acts), ref.critic(obs, acts), rtol=1e-2, atol=1e-2)
    assert abs(fast.log_alpha.item() - np.log(cfg.sac.init_alpha)) > 0.05  # it really trained


def test_checkpoints_cross_between_the_numpy_and_autograd_paths():
    algo = _algo()
    fast, ref = _pair(algo)
    for i in range(3):
        fast.update(_batch(PENDULUM, seed=i))
    ref.load_state_dict(fast.state_dict())  # numpy -> torch optimizer state
    _step_both(fast, ref, _batch(PENDULUM, seed=3), 3)
    _assert_same_learners(fast, ref)
    back = SACLearner(algo.spec, algo.cfg.sac, "cpu")
    back.load_state_dict(ref.state_dict())  # torch -> numpy
    assert back.numpy_update is not None and back.numpy_update.adam.steps == 4 == back.updates
    _step_both(back, ref, _batch(PENDULUM, seed=4), 4)
    _assert_same_learners(back, ref)


@pytest.mark.parametrize("before", [False, True])
def test_the_update_restores_the_callers_denormal_mode(before):
    """Denormals are flushed only while the update runs; the thread's mode is put back as it was."""
    learner = _algo().make_learner("cpu")
    torch.set_flush_denormal(before)
    try:
        assert flush_denormals_enabled() is before
        learner.update(_batch(PENDULUM))
        assert flush_denormals_enabled() is before
        tiny = np.full(4, 1e-39, np.float32)  # a float32 denormal
        assert (float((tiny * np.float32(1.0)).min()) > 0.0) is not before
    finally:
        torch.set_flush_denormal(False)
