"""n-step targets: hand-computed cases and a loop reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl.replay import nstep_transitions


def _frag(rewards, terminated=None, truncated=None):
    r = np.asarray(rewards, dtype=np.float32)
    t, e = r.shape
    term = np.zeros((t, e), bool) if terminated is None else np.asarray(terminated, bool)
    trunc = np.zeros((t, e), bool) if truncated is None else np.asarray(truncated, bool)
    grid = 10 * np.arange(t)[:, None] + np.arange(e)[None, :]
    obs = grid[..., None].astype(np.float32)  # obs value 10t + e
    next_obs = obs + 100.0  # distinct "true next obs" 100 + 10t + e
    actions = grid.astype(np.int64)
    return obs, actions, r, term, trunc, next_obs


def test_termination_inside_window():
    f = _frag([[1], [2], [3], [4]], terminated=[[0], [1], [0], [0]])
    out = nstep_transitions(*f, gamma=0.5, n=3)
    np.testing.assert_allclose(out["rewards"], [1 + 0.5 * 2, 2, 3 + 0.5 * 4, 4])
    np.testing.assert_array_equal(out["nsteps"], [2, 1, 2, 1])
    np.testing.assert_allclose(out["discounts"], [0.0, 0.0, 0.25, 0.5])
    np.testing.assert_array_equal(out["next_obs"][:, 0], [110, 110, 130, 130])
    assert out["rewards"].dtype == np.float32 and out["discounts"].dtype == np.float32


def test_truncation_bootstraps_from_final_obs():
    f = _frag([[1], [2], [3], [4]], truncated=[[0], [1], [0], [0]])
    out = nstep_transitions(*f, gamma=0.5, n=3)
    np.testing.assert_allclose(out["rewards"], [2, 2, 5, 4])
    np.testing.assert_allclose(out["discounts"], [0.25, 0.5, 0.25, 0.5])
    np.testing.assert_array_equal(out["next_obs"][:, 0], [110, 110, 130, 130])


def test_terminated_and_truncated_same_step_counts_as_terminal():
    f = _frag([[1], [2]], terminated=[[1], [0]], truncated=[[1], [0]])
    out = nstep_transitions(*f, gamma=0.9, n=2)
    np.testing.assert_allclose(out["discounts"], [0.0, 0.9])


def test_episode_end_in_one_env_only():
    # env0 terminates at t=0, env1 runs on; flat order is (t, e).
    f = _frag([[1, 1], [1, 2], [1, 3]], terminated=[[1, 0], [0, 0], [0, 0]])
    out = nstep_transitions(*f, gamma=0.9, n=2)
    np.testing.assert_allclose(out["rewards"], [1, 1 + 0.9 * 2, 1.9, 2 + 0.9 * 3, 1, 3], rtol=1e-6)
    np.testing.assert_array_equal(out["nsteps"], [1, 2, 2, 2, 1, 1])
    np.testing.assert_allclose(out["discounts"], [0, 0.81, 0.81, 0.81, 0.9, 0.9], rtol=1e-6)
    np.testing.assert_array_equal(out["next_obs"][:, 0], [100, 111, 120, 121, 120, 121])
    np.testing.assert_array_equal(out["obs"][:, 0], [0, 1, 10, 11, 20, 21])
    np.testing.assert_array_equal(out["actions"], [0, 1, 10, 11, 20, 21])


def test_fragment_boundary_cuts_window():
    f = _frag([[1], [1], [1]])
    out = nstep_transitions(*f, gamma=0.5, n=5)
    np.testing.assert_array_equal(out["nsteps"], [3, 2, 1])
    np.testing.assert_allclose(out["rewards"], [1.75, 1.5, 1.0])
    np.testing.assert_allclose(out["discounts"], [0.125, 0.25, 0.5])
    np.testing.assert_array_equal(out["next_obs"][:, 0], [120, 120, 120])


def test_n1_is_one_step():
    rng = np.random.default_rng(0)
    f = _frag(rng.normal(size=(5, 3)), rng.random((5, 3)) < 0.3, rng.random((5, 3)) < 0.3)
    out = nstep_transitions(*f, gamma=0.99, n=1)
    obs, act, r, term, _, nxt = f
    np.testing.assert_array_equal(out["rewards"], r.reshape(-1))
    np.testing.assert_array_equal(out["next_obs"], nxt.reshape(15, 1))
    np.testing.assert_allclose(out["discounts"], 0.99 * ~term.reshape(-1))
    np.testing.assert_array_equal(out["nsteps"], 1)


def test_bad_inputs():
    f = _frag([[1.0]])
    with pytest.raises(ValueError):
        nstep_transitions(*f, gamma=0.9, n=0)
    obs, act, r, term, trunc, nxt = f
    with pytest.raises(ValueError, match="actions"):
        nstep_transitions(obs, act[:, :0], r, term, trunc, nxt, gamma=0.9, n=1)


def _reference(obs, actions, rewards, term, trunc, next_obs, gamma, n):
    t_len, n_env = rewards.shape
    rows = {k: [] for k in ("obs", "actions", "rewards", "next_obs", "discounts", "nsteps")}
    for t in range(t_len):
        for e in range(n_env):
            ret, k = 0.0, 0
            while k < n and t + k < t_len:
                ret += gamma**k * float(rewards[t + k, e])
                k += 1
                if term[t + k - 1, e] or trunc[t + k - 1, e]:
                    break
            last = t + k - 1
            rows["obs"].append(obs[t, e])
            rows["actions"].append(actions[t, e])
            rows["rewards"].append(ret)
            rows["next_obs"].append(next_obs[last, e])
            rows["discounts"].append(0.0 if term[last, e] else gamma**k)
            rows["nsteps"].append(k)
    return {k: np.array(v) for k, v in rows.items()}


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(
    st.integers(1, 7), st.integers(1, 4), st.integers(1, 6),
    st.floats(0.0, 1.0), st.integers(0, 2**32 - 1),
)
def test_matches_loop_reference(t_len, n_env, n, gamma, seed):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(t_len, n_env, 2)).astype(np.float32)
    actions = rng.integers(0, 5, size=(t_len, n_env, 1))
    rewards = rng.normal(size=(t_len, n_env)).astype(np.float32)
    term = rng.random((t_len, n_env)) < 0.2
    trunc = rng.random((t_len, n_env)) < 0.2
    next_obs = rng.normal(size=(t_len, n_env, 2)).astype(np.float32)
    args = (obs, actions, rewards, term, trunc, next_obs)
    out = nstep_transitions(*args, gamma=gamma, n=n)
    ref = _reference(*args, gamma, n)
    for k in ("obs", "actions", "next_obs", "nsteps"):
        np.testing.assert_array_equal(out[k], ref[k], err_msg=k)
    np.testing.assert_allclose(out["rewards"], ref["rewards"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["discounts"], ref["discounts"], rtol=1e-6, atol=1e-7)
