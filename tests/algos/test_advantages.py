import math

import numpy as np
import pytest
import torch

from distrl.algos.advantages import gae, vtrace


def random_fragment(seed, T=7, B=5):
    """Random (T, B) inputs with terminations and truncations; next_values[t] == values[t+1]
    inside an episode, as the learner's V(next_obs) would be."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    done = rng.random((T, B)) < 0.25
    terminated = done & (rng.random((T, B)) < 0.5)
    truncated = done & ~terminated
    next_values = rng.normal(size=(T, B))  # bootstrap values where an episode ended / at T-1
    next_values[:-1] = np.where(done[:-1], next_values[:-1], values[1:])
    behaviour = rng.normal(-1.0, 0.5, size=(T, B))
    target = behaviour + rng.normal(0.0, 0.7, size=(T, B))
    return dict(rewards=rewards, values=values, next_values=next_values, terminated=terminated,
                truncated=truncated, behaviour=behaviour, target=target)


def t32(x):
    return torch.as_tensor(x, dtype=torch.bool if x.dtype == bool else torch.float32)


def ends(d, t, b):
    return d["terminated"][t, b] or d["truncated"][t, b]


def ref_vtrace(d, gamma, rho_bar, c_bar):
    """The paper's recursion, one scalar at a time."""
    T, B = d["rewards"].shape
    vs, pg = np.zeros((T, B)), np.zeros((T, B))
    for b in range(B):
        for t in reversed(range(T)):
            ratio = math.exp(d["target"][t, b] - d["behaviour"][t, b])
            rho, c = min(rho_bar, ratio), min(c_bar, ratio)
            g = 0.0 if d["terminated"][t, b] else gamma
            r, v, nv = d["rewards"][t, b], d["values"][t, b], d["next_values"][t, b]
            delta = rho * (r + g * nv - v)
            if t == T - 1 or ends(d, t, b):  # trace cut: vs_{t+1} is the bootstrap value
                vs[t, b] = v + delta
                vs_next = nv
            else:
                vs[t, b] = v + delta + g * c * (vs[t + 1, b] - d["values"][t + 1, b])
                vs_next = vs[t + 1, b]
            pg[t, b] = rho * (r + g * vs_next - v)
    return vs, pg


def ref_nstep_returns(d, gamma):
    """Discounted rewards to the end of the episode or fragment, plus the bootstrap."""
    T, B = d["rewards"].shape
    out = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            ret, disc = 0.0, 1.0
            for k in range(t, T):
                ret += disc * d["rewards"][k, b]
                if d["terminated"][k, b]:
                    break
                disc *= gamma
                if d["truncated"][k, b] or k == T - 1:
                    ret += disc * d["next_values"][k, b]
                    break
            out[t, b] = ret
    return out


def ref_gae(d, gamma, lam):
    T, B = d["rewards"].shape
    adv = np.zeros((T, B))
    for b in range(B):
        nxt = 0.0
        for t in reversed(range(T)):
            g = 0.0 if d["terminated"][t, b] else gamma
            delta = d["rewards"][t, b] + g * d["next_values"][t, b] - d["values"][t, b]
            carry = 0.0 if (t == T - 1 or ends(d, t, b)) else nxt
            adv[t, b] = delta + g * lam * carry
            nxt = adv[t, b]
    return adv


def call_vtrace(d, gamma, rho_bar, c_bar, on_policy=False, lam=1.0):
    target = d["behaviour"] if on_policy else d["target"]
    return vtrace(t32(d["behaviour"]), t32(target), t32(d["rewards"]), t32(d["values"]),
                  t32(d["next_values"]), t32(d["terminated"]), t32(d["truncated"]),
                  gamma, rho_bar, c_bar, lam)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (0.8, 0.5), (2.0, 1.5)])
def test_vtrace_matches_reference_loop(seed, rho_bar, c_bar):
    d = random_fragment(seed)
    vs, pg = call_vtrace(d, 0.9, rho_bar, c_bar)
    ref_vs, ref_pg = ref_vtrace(d, 0.9, rho_bar, c_bar)
    np.testing.assert_allclose(vs.numpy(), ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pg.numpy(), ref_pg, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_vtrace_on_policy_is_nstep_returns(seed):
    d = random_fragment(seed)
    vs, pg = call_vtrace(d, 0.95, 1.0, 1.0, on_policy=True)
    returns = ref_nstep_returns(d, 0.95)
    np.testing.assert_allclose(vs.numpy(), returns, rtol=1e-5, atol=1e-5)
    # pg advantage = r + gamma * vs_{t+1} - V = the n-step return minus V.
    np.testing.assert_allclose(pg.numpy(), returns - d["values"], rtol=1e-5, atol=1e-5)


def test_vtrace_lambda_on_policy_equals_gae():
    d = random_fragment(7)
    vs, _ = call_vtrace(d, 0.9, 1.0, 1.0, on_policy=True, lam=0.8)
    adv, ret = gae(t32(d["rewards"]), t32(d["values"]), t32(d["next_values"]),
                   t32(d["terminated"]), t32(d["truncated"]), 0.9, 0.8)
    np.testing.assert_allclose(vs.numpy(), ret.numpy(), rtol=1e-5, atol=1e-5)


def one_step(terminated, truncated):
    """T=2, B=1: reward 1 at step 0, V(next_obs[0]) = V(obs[1]) = 10, V(next_obs[1]) = 100."""
    return dict(rewards=np.array([[1.0], [0.0]]), values=np.array([[0.5], [10.0]]),
                next_values=np.array([[10.0], [100.0]]), terminated=np.array([[terminated], [False]]),
                truncated=np.array([[truncated], [False]]), behaviour=np.zeros((2, 1)),
                target=np.zeros((2, 1)))


@pytest.mark.parametrize("estimator", ["gae", "vtrace"])
def test_termination_vs_truncation(estimator):
    def target_at_0(d):
        if estimator == "vtrace":
            return call_vtrace(d, 0.5, 1.0, 1.0)[0][0, 0].item()
        return gae(t32(d["rewards"]), t32(d["values"]), t32(d["next_values"]), t32(d["terminated"]),
                   t32(d["truncated"]), 0.5, 1.0)[1][0, 0].item()

    assert target_at_0(one_step(True, False)) == pytest.approx(1.0)         # future worth 0
    assert target_at_0(one_step(False, True)) == pytest.approx(1.0 + 0.5 * 10.0)  # bootstrap, no carry
    # Not done: the recursion carries into step 1 (whose own return is 0 + 0.5 * 100).
    assert target_at_0(one_step(False, False)) == pytest.approx(1.0 + 0.5 * 50.0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lam", [0.0, 0.9, 1.0])
def test_gae_matches_reference_loop(seed, lam):
    d = random_fragment(seed)
    adv, ret = gae(t32(d["rewards"]), t32(d["values"]), t32(d["next_values"]),
                   t32(d["terminated"]), t32(d["truncated"]), 0.9, lam)
    ref = ref_gae(d, 0.9, lam)
    np.testing.assert_allclose(adv.numpy(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), ref + d["values"], rtol=1e-5, atol=1e-5)


def test_gae_lambda_one_is_nstep_returns_minus_values():
    d = random_fragment(11, T=9, B=6)
    adv, _ = gae(t32(d["rewards"]), t32(d["values"]), t32(d["next_values"]),
                 t32(d["terminated"]), t32(d["truncated"]), 0.97, 1.0)
    np.testing.assert_allclose(adv.numpy(), ref_nstep_returns(d, 0.97) - d["values"], rtol=1e-5, atol=1e-5)


def test_no_gradient_flows():
    d = random_fragment(0)
    values = t32(d["values"]).requires_grad_()
    adv, _ = gae(t32(d["rewards"]), values, t32(d["next_values"]), t32(d["terminated"]),
                 t32(d["truncated"]), 0.9, 0.9)
    vs, pg = vtrace(t32(d["behaviour"]), t32(d["target"]).requires_grad_(), t32(d["rewards"]), values,
                    t32(d["next_values"]), t32(d["terminated"]), t32(d["truncated"]), 0.9, 1.0, 1.0)
    assert not (adv.requires_grad or vs.requires_grad or pg.requires_grad)
