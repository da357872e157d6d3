"""R2D2's acting half: value rescaling, sequence priorities, n-step targets over sequences, acting, frames once."""

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl.algos.qlearning import worker_epsilon
from distrl.algos.r2d2 import R2D2, R2D2Network
from distrl.algos.r2d2_acting import nstep_targets, rescale, sequence_priorities, unrescale
from distrl.config import load_config
from distrl.core import EnvSpec
from distrl.replay.sequence_replay import SequenceReplay
from distrl.replay.sequences import SequenceAdder
from distrl.replay.store import digest
from distrl.roles.factory import make_algorithm
from tests.algos.same_network import check_acts_with_the_learners_network
from tests.replay.stacking import LeafEnv, Runner, make_envs, make_leaf_envs, reloaded

SPEC = EnvSpec(spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(3))


def make_cfg(burn_in=2, length=4, n_step=2, *extra):
    return load_config(None, ["algo=r2d2", f"sequence.burn_in={burn_in}", f"sequence.length={length}",
                              f"r2d2.n_step={n_step}", "model.hidden=[16]", "model.core_size=8", *extra])


def make_algo(cfg, spec=SPEC):
    return make_algorithm(cfg, spec)


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


# ------------------------------------------------------------------ acting


def perturbed_learner(algo):
    learner = algo.make_learner("cpu")
    with torch.no_grad():  # away from the initial weights: loading them must matter
        for p in learner.q.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return learner


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_the_policy_steps_the_learners_network(core):
    algo = make_algo(make_cfg(2, 4, 2, f"model.core={core}"))
    learner = perturbed_learner(algo)
    policy = algo.make_policy(0, 1, 0)
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(4, 3)).astype(np.float32)
    state = rng.normal(size=(4, 2 if core == "lstm" else 1, 8)).astype(np.float32)
    check_acts_with_the_learners_network(policy, learner.q, learner.get_weights(), "step", obs, state)
    assert isinstance(policy.net, R2D2Network)
    assert policy.initial_state(4).shape == state.shape and not policy.initial_state(4).any()


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_acting_carries_each_envs_state_and_resets_it_at_episode_ends(core):
    """The evaluator acting step by step is the learner's network stepped from zeros, each env's state
    zeroed after its episode ended: Q-values, greedy actions and the stored states before each step."""
    algo = make_algo(make_cfg(2, 4, 2, f"model.core={core}", "r2d2.dueling=true"))
    learner = perturbed_learner(algo)
    policy = algo.make_policy(-1, 1, 0)
    policy.set_weights(learner.get_weights(), 3)
    T, E = 9, 3
    obs = np.random.default_rng(5).normal(size=(T, E, 3)).astype(np.float32)
    done = np.zeros((T, E), bool)
    done[2, 1] = done[5, 0] = done[5, 2] = True
    state = torch.zeros(E, *policy.state_shape)
    for t in range(T):
        actions, extras = policy.act(obs[t], explore=True)  # the evaluator is greedy even when exploring
        with torch.no_grad():
            q_ref, after = learner.q.step(torch.as_tensor(obs[t]), state)
        np.testing.assert_array_equal(extras["q"], q_ref.numpy())
        np.testing.assert_array_equal(actions, q_ref.numpy().argmax(1))
        np.testing.assert_array_equal(extras["state"], state.numpy())
        assert extras["q"].dtype == np.float32 and extras["state"].shape == (E, *policy.state_shape)
        assert t == 0 or extras["state"].any()
        policy.episodes_ended(done[t])
        state = after * torch.as_tensor(~done[t], dtype=torch.float32)[:, None, None]
    # ... and so the learner's fused unroll over the same steps, reset where each episode started.
    first = np.zeros((T, E), bool)
    first[1:] = done[:-1]
    with torch.no_grad():
        out, _ = learner.q.unroll(torch.as_tensor(obs), torch.zeros(E, *policy.state_shape), torch.as_tensor(first))
        np.testing.assert_allclose(learner.q.head(out)[-1].numpy(), extras["q"], rtol=1e-5, atol=1e-6)


def test_worker_epsilons_and_spec_checks():
    algo = make_algo(make_cfg())
    policies = [algo.make_policy(i, 4, i) for i in range(4)]
    assert [p.epsilon for p in policies] == [worker_epsilon(algo.cfg, i, 4, 0) for i in range(4)]
    assert algo.make_policy(-1, 4, 0).epsilon == 0.0
    assert R2D2.check_spec(SPEC) is None
    assert "Discrete" in R2D2.check_spec(EnvSpec(SPEC.observation_space, spaces.Box(-1, 1, (2,))))


def test_an_out_of_band_reset_abandons_the_adders_open_episodes():
    algo = make_algo(make_cfg())
    policy = algo.make_policy(0, 1, 0)
    policy.set_weights(algo.make_learner("cpu").get_weights(), 0)

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


# ------------------------------------------------------------------ frames stored once


def _framed_and_plain(chunk: int, capacity: int):
    box, k = spaces.Box(0, 255, (4, 10, 10), np.uint8), 4
    cfg = make_cfg(2, 4, 2, "model.features=16", "model.core_size=8", f"sequence.chunk_length={chunk}",
                   "sequence.period=2")
    framed, plain = (make_algo(cfg, EnvSpec(box, spaces.Discrete(2), frame_stack=s)) for s in (k, 0))
    weights = framed.make_learner("cpu").get_weights()
    policies = framed.make_policy(0, 1, 3), plain.make_policy(0, 1, 3)
    for p in policies:
        p.set_weights(weights, 0)
    L = policies[0].sequence_length
    return policies, (SequenceReplay(capacity, L, seed=4), SequenceReplay(capacity, L, seed=4))


@pytest.mark.parametrize("padding", ["reset", "zero"])
@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_frames_stored_once_in_sequences_sample_the_stacks_the_env_emitted(padding, chunk):
    """A FrameStackObservation env through R2D2's postprocess into sequence replay, frames once and stacks per
    step side by side: identical priorities and samples bit for bit (episode starts, burn-in padding, the
    pseudo-steps holding truncated episodes' final stacks, eviction), each stack one the env emitted."""
    (policy, reference), (buf, ref_buf) = _framed_and_plain(chunk, capacity=90)
    runner, emitted = Runner(make_envs(2, 4, padding, (10, 10), seed=chunk), chunk), set()
    for i in range(10):
        traj = runner.rollout(5, act=lambda o: policy.act(o, explore=True), ended=policy.episodes_ended)
        emitted |= {s.tobytes() for s in (*traj.obs.reshape(-1, 4, 10, 10), *traj.next_obs.reshape(-1, 4, 10, 10))}
        (msg, prios), (want, want_prios) = policy.postprocess(traj), reference.postprocess(traj)
        np.testing.assert_array_equal(prios, want_prios)
        assert "chunk/obs" not in msg and msg["frames/obs"].nbytes <= want["chunk/obs"].nbytes
        buf.add(msg, prios)
        ref_buf.add(want, want_prios)
        if len(buf):
            (x, idx, w), (y, ref_idx, ref_w) = buf.sample_many(2, 8), ref_buf.sample_many(2, 8)
            np.testing.assert_array_equal(idx, ref_idx)
            assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x if k != "_generation")
            assert {s.tobytes() for s in x["obs"][x["valid"] > 0]} <= emitted
            for b, g in ((buf, x), (ref_buf, y)):
                b.update_priorities(idx, np.arange(idx.size, dtype=float).reshape(idx.shape), g["_generation"])
    assert buf.stored_steps == ref_buf.stored_steps and buf.dropped_items == ref_buf.dropped_items


def test_framed_sequence_replay_round_trips_through_the_checkpoint_file(tmp_path):
    (policy, _), (buf, _) = _framed_and_plain(3, capacity=60)
    runner = Runner(make_envs(2, 4, "zero", (10, 10), seed=9), 9)
    msgs = [policy.postprocess(runner.rollout(4, act=lambda o: policy.act(o, explore=True),
                                              ended=policy.episodes_ended)) for _ in range(12)]
    for msg, prios in msgs[:8]:
        buf.add(msg, prios)
    fresh = reloaded(tmp_path, buf, SequenceReplay(60, policy.sequence_length, seed=99))
    for msg, prios in msgs[8:]:
        buf.add(msg, prios)
        fresh.add(msg, prios)
    (x, ia, _), (y, ib, _) = buf.sample_many(2, 6), fresh.sample_many(2, 6)
    np.testing.assert_array_equal(ia, ib)
    assert all(np.array_equal(x[k], y[k]) for k in x)
    assert digest(fresh.state_dict()) == digest(buf.state_dict())


def test_image_leaves_of_a_dict_observation_are_stored_once_per_step_and_sampled_as_uint8():
    """Sequence replay keeps each step's observation once (the next one is the next step's, an episode's
    last in its pseudo-step), so a Dict's image leaves already cost a frame per stored step: each chunk is
    sent once, its images are the steps' own, and the learner trains on them as uint8."""
    from distrl import tree
    from distrl.roles.learning import update_once

    cfg = make_cfg(2, 4, 2, "model.features=16", "sequence.chunk_length=4", "sequence.period=2")
    algo = make_algo(cfg, EnvSpec(LeafEnv().observation_space, spaces.Discrete(2)))
    learner, policy = algo.make_learner("cpu"), algo.make_policy(0, 1, 3)
    policy.set_weights(learner.get_weights(), 0)
    runner, buf = Runner(make_leaf_envs(2, seed=5), 5), SequenceReplay(200, policy.sequence_length)
    sent, steps, emitted = set(), 0, set()
    for _ in range(12):
        traj = runner.rollout(5, act=lambda o: policy.act(o, explore=True), ended=policy.episodes_ended)
        steps += traj.rewards.size + int((traj.terminated | traj.truncated).sum())  # + pseudo-steps
        emitted |= {x.tobytes() for x in (*tree.flatten_lead(traj.obs, 2)["image"],
                                          *tree.flatten_lead(traj.next_obs, 2)["image"])}
        msg, prios = policy.postprocess(traj)
        assert msg["chunk/obs.image"].dtype == np.uint8 and msg["chunk/obs.image"].shape[1:] == (4, 7, 7, 3)
        assert not any(k.startswith("frames/") or "next" in k for k in msg)
        assert not sent & set(msg["chunk/key"].tolist())  # a chunk's images travel once
        sent |= set(msg["chunk/key"].tolist())
        buf.add(msg, prios)
    assert len(sent) * 4 >= buf.stored_steps and buf.stored_steps <= steps
    batches, idx, w = buf.sample_many(1, 16)
    batch = {k: v[0] for k, v in batches.items()} | {"weights": w[0]}
    images = batch["obs.image"][batch["valid"] > 0]
    assert images.dtype == batch["obs.views#0"].dtype == np.uint8 and {x.tobytes() for x in images} <= emitted
    assert np.isfinite(update_once(learner, batch)["loss"])


def test_stacks_that_do_not_shift_are_refused():
    adder = SequenceAdder(1, 4, 2, 0, 3, seed=0, frame_stack=2)
    obs = np.arange(6, dtype=np.uint8).reshape(3, 1, 2, 1)  # [0,1], [2,3], [4,5]: no frame carried over
    with pytest.raises(ValueError, match="shift by one frame"):
        adder.add({"obs": obs, "rewards": np.zeros((3, 1), np.float32)}, {"obs": obs}, np.zeros((3, 1), bool),
                  np.zeros((3, 1), bool), np.zeros((3, 1, 1, 2), np.float32), 0)
