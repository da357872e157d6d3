"""R2D2: value rescaling, n-step sequence targets, burn-in, the learner, numpy acting, postprocess."""
import contextlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl.algos.apex_dqn_acting import worker_epsilon
from distrl.algos.common import to_numpy_weights
from distrl.algos.r2d2 import R2D2, build_network
from distrl.algos.r2d2_acting import (NumpyR2D2Net, R2D2Policy, nstep_targets, rescale, sequence_priorities,
                                      unrescale)
from distrl.config import load_config
from distrl.core import EnvSpec

SPEC = EnvSpec(spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(3))


def make_cfg(burn_in=2, length=4, n_step=2, *extra):
    return load_config(None, ["algo=r2d2", f"sequence.burn_in={burn_in}", f"sequence.length={length}",
                              f"r2d2.n_step={n_step}", "r2d2.hidden=[16]", "r2d2.core_size=8", *extra])


def make_batch(rng, seq_len, batch, state_shape, first_at=None):
    """A random time-major batch; `first_at[b]` = index of item b's episode start (padding before it)."""
    mask = np.ones((seq_len, batch), np.float32)
    first = np.zeros((seq_len, batch), bool)
    for b, t in enumerate(first_at or []):
        if t is not None:
            mask[:t, b] = 0.0
            first[t, b] = True
    obs = rng.normal(size=(seq_len, batch, 3)).astype(np.float32) * mask[..., None]
    state = rng.normal(size=(batch, *state_shape)).astype(np.float32)
    state[first.any(axis=0)] = 0.0  # items starting at their episode start store a zero state
    return {"obs": obs, "actions": rng.integers(0, 3, (seq_len, batch)) * mask.astype(np.int64),
            "rewards": rng.normal(size=(seq_len, batch)).astype(np.float32) * mask,
            "discount": np.ones((seq_len, batch), np.float32), "mask": mask, "valid": mask.copy(),
            "first": first, "state": state, "version": np.zeros(batch, np.int32),
            "weights": rng.uniform(0.5, 1.0, batch).astype(np.float32)}


def learner_for(cfg):
    return R2D2(cfg, SPEC).make_learner("cpu")


# ------------------------------------------------------------------ value rescaling


@settings(max_examples=300, deadline=None)
@given(st.floats(-1e8, 1e8, allow_nan=False), st.sampled_from([0.0, 1e-3, 1e-2, 0.5]))
def test_rescale_round_trip_float64(x, eps):
    y = rescale(np.float64(x), eps)
    textbook = np.sign(x) * (np.sqrt(abs(x) + 1.0) - 1.0) + eps * x
    assert y == pytest.approx(textbook, rel=1e-9, abs=1e-12)
    assert unrescale(y, eps) == pytest.approx(x, rel=1e-9, abs=1e-12)
    assert rescale(unrescale(np.float64(x), eps), eps) == pytest.approx(x, rel=1e-9, abs=1e-12)


def test_rescale_inverse_matches_the_paper_formula_and_float32_torch():
    y = np.concatenate([-np.logspace(-7, 6, 200), [0.0], np.logspace(-7, 6, 200)])
    eps = 1e-3
    paper = np.sign(y) * (((np.sqrt(1 + 4 * eps * (np.abs(y) + 1 + eps)) - 1) / (2 * eps)) ** 2 - 1)
    np.testing.assert_allclose(unrescale(y, eps), paper, rtol=1e-6)
    x = torch.as_tensor(y, dtype=torch.float32)
    np.testing.assert_allclose(unrescale(rescale(x, eps), eps).numpy(), y, rtol=2e-5, atol=1e-12)
    assert float(rescale(torch.tensor(0.0), eps)) == 0.0


# ------------------------------------------------------------------ priorities and n-step targets


def test_priority_mix_of_max_and_mean_over_real_trained_steps():
    abs_td = np.array([[1.0, 2.0], [3.0, 0.0], [7.0, 5.0]])
    mask = np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]])  # item 0's last step is not real: its 7 is ignored
    out = sequence_priorities(abs_td, mask, 0.9)
    np.testing.assert_allclose(out, [0.9 * 3 + 0.1 * 2, 0.9 * 5 + 0.1 * 7 / 3])
    np.testing.assert_allclose(sequence_priorities(abs_td, mask, 0.0), [2.0, 7 / 3])


def reference_targets(values, rewards, discount, mask, valid, gamma, n, start, length):
    """Per step: sum real rewards, then bootstrap from the step after the last one counted."""
    out = np.zeros((length, rewards.shape[1]))
    for b in range(rewards.shape[1]):
        for i in range(length):
            t = start + i
            if not mask[t, b]:
                continue
            ret, scale, k = 0.0, 1.0, 0
            while k < n and mask[t + k, b]:
                ret += scale * rewards[t + k, b]
                scale *= gamma * discount[t + k, b]
                k += 1
            out[i, b] = ret + scale * valid[t + k, b] * values[t + k, b]
    return out


def hand_built_sequences():
    """burn_in 2, length 4, n 2 (L = 8); rewards 1 on real steps, V = 10 (20 on the truncated pseudo-step).

    item 0: real throughout; item 1: terminates at step 4 (pseudo-step 5, padding after);
    item 2: truncated at step 3 (pseudo-step 4); item 3: starts its episode at step 2 (padding before).
    """
    L, B = 8, 4
    mask, valid = np.ones((L, B)), np.ones((L, B))
    discount = np.ones((L, B))
    mask[5:, 1], valid[6:, 1], discount[4, 1] = 0, 0, 0
    mask[4:, 2], valid[5:, 2] = 0, 0
    mask[:2, 3], valid[:2, 3] = 0, 0
    values = np.full((L, B), 10.0)
    values[4, 2] = 20.0
    return values * valid, mask.copy(), discount, mask, valid


def test_nstep_targets_termination_truncation_padding():
    values, rewards, discount, mask, valid = hand_built_sequences()
    out = nstep_targets(values, rewards, discount, mask, valid, 0.5, 2, 2, 4)
    # item 1: step 2 = 1 + .5 + .25 * 10; step 3 reaches the terminal step 4: no bootstrap; step 4 is the last real.
    np.testing.assert_allclose(out[:, 1], [4.0, 1.5, 1.0, 0.0])
    # item 2: step 2 bootstraps two steps on from the pseudo-step (V = 20), step 3 one step on.
    np.testing.assert_allclose(out[:, 2], [1.5 + 0.25 * 20, 1 + 0.5 * 20, 0.0, 0.0])
    np.testing.assert_allclose(out[:, 0], [4.0] * 4)
    np.testing.assert_allclose(out, reference_targets(values, rewards, discount, mask, valid, 0.5, 2, 2, 4))


@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_targets_match_the_per_step_reference_numpy_and_torch(n):
    rng = np.random.default_rng(n)
    L, B, start, length = 4 + 6 + n, 16, 4, 6
    real = rng.integers(3, L, B)  # episode ends after `real` steps (a pseudo-step follows) ...
    terminated = rng.random(B) < 0.5
    mask = (np.arange(L)[:, None] < real).astype(np.float64)
    mask[:, 0] = 1.0  # ... except item 0, which runs on
    valid = (np.arange(L)[:, None] <= real).astype(np.float64)
    valid[:, 0] = 1.0
    valid[:, 2::3] = mask[:, 2::3]  # windows cut right after a real step (no pseudo-step): nothing to bootstrap from
    discount = np.ones((L, B))
    discount[real[1:] - 1, np.arange(1, B)] = np.where(terminated[1:], 0.0, 1.0)
    values, rewards = rng.normal(size=(L, B)), rng.normal(size=(L, B)) * mask
    args = (0.97, n, start, length)
    expected = reference_targets(values, rewards, discount, mask, valid, *args)
    np.testing.assert_allclose(nstep_targets(values, rewards, discount, mask, valid, *args), expected)
    as_t = [torch.as_tensor(a) for a in (values, rewards, discount, mask, valid)]
    np.testing.assert_allclose(nstep_targets(*as_t, *args).numpy(), expected)


# ------------------------------------------------------------------ the learner


def numpy_unroll(net, obs, state, first):
    """Q (L, B, A) stepping the numpy network from `state`, zeroing it where `first`."""
    qs = []
    for t in range(len(obs)):
        state = state * (~first[t])[:, None, None]
        q, state = net.step(obs[t], state)
        qs.append(q)
    return np.stack(qs)


@pytest.mark.parametrize("core,double,rescaling", [("lstm", True, True), ("gru", False, False)])
def test_learner_td_matches_a_step_by_step_reference(core, double, rescaling):
    cfg = make_cfg(2, 4, 2, f"r2d2.core={core}", f"r2d2.double={double}", f"r2d2.value_rescaling={rescaling}")
    learner = learner_for(cfg)
    with torch.no_grad():
        for p in learner.target.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    rng = np.random.default_rng(3)
    batch = make_batch(rng, 8, 5, (2 if core == "lstm" else 1, 8), first_at=[None, 2, 1, None, 0])
    batch["discount"][3, 0] = 0.0  # item 0 terminates at step 3 ...
    batch["mask"][4:, 0] = batch["valid"][5:, 0] = 0.0  # ... then its pseudo-step, then padding (trained, unreal)
    q = numpy_unroll(NumpyR2D2Net(learner.get_weights(), core), batch["obs"], batch["state"], batch["first"])
    qt = numpy_unroll(NumpyR2D2Net(to_numpy_weights(learner.target), core), batch["obs"], batch["state"],
                      batch["first"])
    best = q.argmax(-1)[..., None] if double else qt.argmax(-1)[..., None]
    values = np.take_along_axis(qt, best, -1)[..., 0]
    eps = learner.cfg.rescale_eps
    values = unrescale(values, eps) if rescaling else values
    target = reference_targets(values, batch["rewards"], batch["discount"], batch["mask"], batch["valid"],
                               learner.cfg.gamma, 2, 2, 4)
    target = rescale(target, eps) if rescaling else target
    q_taken = np.take_along_axis(q, batch["actions"][..., None], -1)[2:6, :, 0]
    expected_td = (q_taken - target) * batch["mask"][2:6]
    loss, td, _ = learner.loss_and_td({k: torch.as_tensor(v) for k, v in batch.items()})
    np.testing.assert_allclose(td.numpy() * batch["mask"][2:6], expected_td, atol=2e-5)
    # Importance-weighted squared TD over the trained real steps, averaged over those steps.
    expected_loss = (0.5 * expected_td ** 2 * batch["weights"]).sum() / batch["mask"][2:6].sum()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-4)
    out = learner.update(batch)
    np.testing.assert_allclose(out["priorities"], sequence_priorities(np.abs(expected_td), batch["mask"][2:6], 0.9),
                               atol=2e-5)


def burn_in_gradients(learner, batch):
    """Gradients of the loss w.r.t. observations, the stored state and the parameters."""
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    t["obs"].requires_grad_(True)
    t["state"].requires_grad_(True)
    learner.q.zero_grad(set_to_none=True)
    loss, _, _ = learner.loss_and_td(t)
    loss.backward()
    return t["obs"].grad, t["state"].grad, [p.grad.clone() for p in learner.q.parameters()]


def test_burn_in_gives_no_gradient(monkeypatch):
    learner = learner_for(make_cfg(4, 5, 2))
    batch = make_batch(np.random.default_rng(0), 11, 6, (2, 8))
    obs_grad, state_grad, param_grads = burn_in_gradients(learner, batch)
    assert torch.all(obs_grad[:4] == 0) and state_grad is None
    assert obs_grad[4:].abs().max() > 0
    # The burn-in does shape the trained Q-values, so gradient through it would not be zero ...
    perturbed = dict(batch, obs=batch["obs"] + np.float32(0.5) * (np.arange(11) < 4)[:, None, None])
    with torch.no_grad():
        assert learner.loss_and_td({k: torch.as_tensor(v) for k, v in perturbed.items()})[0] != \
            learner.loss_and_td({k: torch.as_tensor(v) for k, v in batch.items()})[0]
    # ... and the parameter gradients are those of a learner without burn-in whose stored state is the
    # burned-in one as a constant: no term d loss / d state * d state / d params.
    ref = learner_for(make_cfg(0, 5, 2))
    ref.q.load_state_dict(learner.q.state_dict())
    ref.target.load_state_dict(learner.target.state_dict())
    with torch.no_grad():
        keep = torch.ones(4, 6, 1)
        _, burned = learner.q.unroll(torch.as_tensor(batch["obs"][:4]), torch.as_tensor(batch["state"]), keep, [])
    sliced = {k: (v[4:] if v.ndim >= 2 and k != "state" else v) for k, v in batch.items()}
    sliced["state"] = burned.numpy()
    _, _, ref_grads = burn_in_gradients(ref, sliced)
    for g, r in zip(param_grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7)
    # The check bites: with the burn-in unrolled under gradient, it reaches the burn-in observations.
    monkeypatch.setattr(torch, "no_grad", contextlib.nullcontext)
    leaky_obs_grad, _, leaky = burn_in_gradients(learner, batch)
    assert leaky_obs_grad[:4].abs().max() > 0
    assert any(not torch.allclose(g, r) for g, r in zip(leaky, ref_grads))


def test_update_reduces_the_loss_and_returns_item_priorities():
    cfg = load_config(None, ["algo=r2d2", "sequence.burn_in=2", "sequence.length=6", "r2d2.n_step=3",
                             "r2d2.lr=0.003", "r2d2.target_update_interval=1000"])
    learner = learner_for(cfg)  # the default 64-unit torso and core
    batch = make_batch(np.random.default_rng(1), 11, 16, (2, 64), first_at=[2] * 4)
    batch["rewards"] = np.sign(batch["rewards"]) * batch["mask"]
    losses = [learner.update(batch)["loss"] for _ in range(40)]
    out = learner.update(batch)
    assert out["priorities"].shape == (16,) and np.all(np.isfinite(out["priorities"]))
    assert np.all(out["priorities"] >= 0) and out["grad_norm"] > 0
    assert np.mean(losses[-5:]) < 0.3 * losses[0]
    assert learner.updates == 41


def test_learner_rejects_sequences_of_another_length():
    learner = learner_for(make_cfg(2, 4, 2))
    with pytest.raises(ValueError, match="cfg.sequence"):
        learner.update(make_batch(np.random.default_rng(0), 9, 2, (2, 8)))


def test_state_dict_round_trip_resumes_identically():
    cfg = make_cfg(2, 4, 2, "r2d2.target_update_interval=2")
    rng = np.random.default_rng(2)
    batches = [make_batch(rng, 8, 4, (2, 8), first_at=[2, None, 1, None]) for _ in range(4)]
    a = learner_for(cfg)
    for b in batches[:3]:
        a.update(b)
    b_ = learner_for(make_cfg(2, 4, 2, "r2d2.target_update_interval=2", "seed=5"))
    b_.load_state_dict(a.state_dict())
    assert b_.updates == 3
    out_a, out_b = a.update(batches[3]), b_.update(batches[3])
    np.testing.assert_array_equal(out_a["priorities"], out_b["priorities"])
    assert out_a["loss"] == out_b["loss"]
    for (k, v), w in zip(a.state_dict()["target"].items(), b_.state_dict()["target"].values()):
        torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)
    for k, v in a.get_weights().items():
        np.testing.assert_array_equal(v, b_.get_weights()[k])


# ------------------------------------------------------------------ numpy acting


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_numpy_acting_matches_torch_with_state_carried_and_reset(core):
    cfg = make_cfg(2, 4, 2, f"r2d2.core={core}", "r2d2.dueling=true")
    torch.manual_seed(4)
    net = build_network(SPEC, cfg.r2d2)
    policy = R2D2Policy(SPEC, cfg.r2d2, -1, 1, 0, cfg.sequence)
    policy.set_weights(to_numpy_weights(net), 3)
    T, E = 9, 3
    obs = np.random.default_rng(5).normal(size=(T, E, 3)).astype(np.float32)
    done = np.zeros((T, E), bool)
    done[2, 1] = done[5, 0] = done[5, 2] = True
    first = np.zeros((T, E), bool)
    first[1:] = done[:-1]
    keep = torch.as_tensor(~first, dtype=torch.float32)[..., None]
    zero = torch.zeros(E, *policy.state_shape)
    with torch.no_grad():
        out, _ = net.unroll(torch.as_tensor(obs), zero, keep, [3, 6])
        q_ref = net.head(out).numpy()
    for t in range(T):
        actions, extras = policy.act(obs[t], explore=True)  # the evaluator is greedy even when exploring
        np.testing.assert_allclose(extras["q"], q_ref[t], atol=1e-5)
        np.testing.assert_array_equal(actions, q_ref[t].argmax(1))
        with torch.no_grad():  # the state before step t: torch's after step t - 1, zeroed where an episode ended
            resets = [r for r in (3, 6) if r < t]
            _, before = net.unroll(torch.as_tensor(obs[:t]), zero, keep[:t], resets) if t else (None, zero)
        np.testing.assert_allclose(extras["state"], before.numpy() * (~first[t])[:, None, None], atol=1e-5)
        assert extras["q"].dtype == np.float32 and extras["state"].shape == (E, *policy.state_shape)
        policy.episodes_ended(done[t])


def test_worker_epsilons_and_spec_checks():
    cfg = make_cfg()
    policies = [R2D2Policy(SPEC, cfg.r2d2, i, 4, i) for i in range(4)]
    assert [p.epsilon for p in policies] == [worker_epsilon(cfg.r2d2, i, 4, 0) for i in range(4)]
    assert R2D2Policy(SPEC, cfg.r2d2, -1, 4, 0).epsilon == 0.0
    assert R2D2.check_spec(SPEC) is None
    assert "Discrete" in R2D2.check_spec(EnvSpec(SPEC.observation_space, spaces.Box(-1, 1, (2,))))


def test_an_out_of_band_reset_abandons_the_adders_open_episodes():
    cfg = make_cfg()
    policy = R2D2Policy(SPEC, cfg.r2d2, 0, 1, 0, cfg.sequence)
    policy.set_weights(to_numpy_weights(build_network(SPEC, cfg.r2d2)), 0)

    class Adder:
        resets = 0

        def reset(self):
            self.resets += 1

    policy._adder = adder = Adder()
    policy.act(np.zeros((2, 3), np.float32), explore=True)
    policy.episodes_ended(np.array([True, False]))  # an ordinary step's episode end: the adder sees it
    assert adder.resets == 0
    policy.episodes_ended(np.ones(2, bool))  # envs reset with no step in between (a worker restore)
    assert adder.resets == 1
    assert not policy.act(np.ones((2, 3), np.float32), explore=True)[1]["state"].any()  # both envs start afresh


def test_the_acting_module_never_imports_torch():
    code = "import sys, distrl.algos.r2d2_acting; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ------------------------------------------------------------------ postprocess -> SequenceReplay -> learner


def rollout_fragments(cfg, spec, learner, fragment_length, count, env_kwargs):
    from distrl.envs import VectorEnv
    from distrl.roles.rollout import Rollout

    policy = R2D2Policy(spec, cfg.r2d2, 0, 1, 7, cfg.sequence)
    policy.set_weights(learner.get_weights(), 0)
    rollout = Rollout(policy, VectorEnv("CartPole-v1", 3, 0, env_kwargs), fragment_length, 0)
    return [rollout.sample() for _ in range(count)]


def test_postprocess_feeds_sequence_replay_and_worker_priorities_match_the_learner():
    replay_module = pytest.importorskip("distrl.replay.sequence_replay")
    from distrl.envs import env_spec

    kwargs = {"max_episode_steps": 16}  # random CartPole: episodes both terminate and get truncated
    cfg = load_config(None, ["algo=r2d2", "sequence.burn_in=4", "sequence.length=6", "sequence.period=3",
                             "sequence.chunk_length=4", "r2d2.n_step=3", "r2d2.hidden=[16]", "r2d2.core_size=8"])
    spec = env_spec("CartPole-v1", kwargs)
    learner = R2D2(cfg, spec).make_learner("cpu")  # target == online: both act as the worker's network
    frags = rollout_fragments(cfg, spec, learner, 30, 3, kwargs)
    replay = replay_module.SequenceReplay(10_000, 4 + 6 + 3, prioritized=False)
    for f in frags:
        assert f.priorities.shape == f.data["version"].shape == (f.info.items,)
        replay.add(f.data, f.priorities)
    assert len(replay) == sum(f.info.items for f in frags) > 20 and replay.dropped_items == 0
    batches, idx, weights = replay.sample_many(1, 128)
    batch = {k: v[0] for k, v in batches.items()} | {"weights": weights[0]}
    real, valid = batch["mask"] == 1, batch["valid"] == 1
    assert np.any(real & (batch["discount"] == 0)), "no terminated episode in the sample"
    assert np.any(real[:-1] & (batch["discount"][:-1] == 1) & valid[1:] & ~real[1:]), "no truncated episode"
    out = learner.update(batch)
    # Same weights, same stored states: the learner's TD errors are the worker's (incl. the pseudo-step's Q).
    worker = np.concatenate([f.priorities for f in frags])
    np.testing.assert_allclose(out["priorities"], worker[idx[0]], rtol=1e-4, atol=1e-5)


def test_a_fragment_without_items_sends_an_empty_message_shaped_like_a_real_one():
    replay_module = pytest.importorskip("distrl.replay.sequence_replay")
    from distrl.envs import env_spec

    cfg = load_config(None, ["algo=r2d2", "r2d2.hidden=[16]", "r2d2.core_size=8"])
    spec = env_spec("CartPole-v1")
    learner = R2D2(cfg, spec).make_learner("cpu")
    empty = rollout_fragments(cfg, spec, learner, 1, 1, None)[0]  # one step: no sequence can be complete
    full = rollout_fragments(cfg, spec, learner, 64, 1, None)[0]
    assert empty.info.items == 0 and empty.priorities.shape == (0,) and full.info.items > 0
    assert sorted(empty.data) == sorted(full.data)
    for k, v in full.data.items():
        assert (empty.data[k].shape[1:], empty.data[k].dtype) == (v.shape[1:], v.dtype), k
        assert len(empty.data[k]) == 0
    replay = replay_module.SequenceReplay(10_000, 8 + 16 + 3)
    replay.add(empty.data, empty.priorities)  # first: the store allocates from it
    replay.add(full.data, full.priorities)
    replay.add(empty.data, empty.priorities)
    assert len(replay) == full.info.items
