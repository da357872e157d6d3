"""R2D2's numpy half: value rescaling, sequence priorities, n-step targets over sequences, acting."""
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
from distrl.algos.r2d2_acting import R2D2Policy, nstep_targets, rescale, sequence_priorities, unrescale
from distrl.config import load_config
from distrl.core import EnvSpec

SPEC = EnvSpec(spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(3))


def make_cfg(burn_in=2, length=4, n_step=2, *extra):
    return load_config(None, ["algo=r2d2", f"sequence.burn_in={burn_in}", f"sequence.length={length}",
                              f"r2d2.n_step={n_step}", "r2d2.hidden=[16]", "r2d2.core_size=8", *extra])


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
