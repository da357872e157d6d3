"""DHC: acting with the learner's network, masked attention, per-agent n-step targets, the learner,
postprocess -> replay."""
import contextlib
import itertools

import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl.algos.dhc import DHC, DHCNetwork
from distrl.algos.dhc_acting import agent_nstep_targets, agent_priorities
from distrl.config import load_config
from distrl.core import EnvSpec, Trajectory
from distrl.envs.mapf import MAPF
from distrl.models.torsos import ConvTorso, MLPTorso
from distrl.roles.factory import make_algorithm
from distrl.roles.learning import update_once
from tests.algos.same_network import check_acts_with_the_learners_network

IMAGE = EnvSpec(spaces.Box(0.0, 1.0, (7, 5, 5), np.float32), spaces.Discrete(5))
FLAT = EnvSpec(spaces.Box(-1.0, 1.0, (6,), np.float32), spaces.Discrete(4))


def make_cfg(burn_in=2, length=4, n_step=2, *extra):
    return load_config(None, ["algo=dhc", f"sequence.burn_in={burn_in}", f"sequence.length={length}",
                              f"dhc.n_step={n_step}", "model.conv_channels=[8]", "model.hidden=[8]",
                              "model.core_size=16", *extra])


def learner_for(cfg, spec=IMAGE):
    return make_algorithm(cfg, spec).make_learner("cpu")


def with_agents(spec, agents):
    """`spec` for envs of `agents` agents: the policy keeps that many states per env."""
    return EnvSpec(spec.observation_space, spec.action_space, agents)


def tensors(batch):
    return {k: torch.as_tensor(v) for k, v in batch.items()}


def random_masks(rng, shape, n, p=0.5):
    """Comm masks (..., N, N) of active agents (no diagonal) and the active flags (..., N)."""
    active = rng.random((*shape, n)) < 0.8
    mask = (rng.random((*shape, n, n)) < p) & active[..., None] & active[..., None, :] & ~np.eye(n, dtype=bool)
    return mask, active


# ------------------------------------------------------------------ acting with the learner's network


def perturbed_learner(algo):
    learner = algo.make_learner("cpu")
    with torch.no_grad():  # biases away from 0 and away from the initial weights: loading them must matter
        for p in learner.q.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return learner


def joint_obs(rng, shape, agents, spec):
    comm_mask, active = random_masks(rng, shape, agents)
    return {"obs": rng.random((*shape, agents, *spec.observation_space.shape)).astype(np.float32),
            "comm_mask": comm_mask, "active": active}


@pytest.mark.parametrize("spec, core", [(IMAGE, "gru"), (FLAT, "lstm")])
def test_the_policy_steps_the_learners_network(spec, core):
    algo = make_algorithm(make_cfg(2, 4, 2, f"model.core={core}"), with_agents(spec, 4))
    learner = perturbed_learner(algo)
    policy = algo.make_policy(0, 1, 0)
    rng = np.random.default_rng(1)
    obs = joint_obs(rng, (3,), 4, spec)
    state = rng.normal(size=(3, 4, 2 if core == "lstm" else 1, 16)).astype(np.float32)
    check_acts_with_the_learners_network(policy, learner.q, learner.get_weights(), "step", obs, state)
    assert isinstance(policy.net, DHCNetwork)
    assert isinstance(policy.net.torso, ConvTorso if spec is IMAGE else MLPTorso)


@pytest.mark.parametrize("spec,comm,agents,core", [(IMAGE, True, 4, "gru"), (IMAGE, False, 3, "gru"),
                                                   (FLAT, True, 1, "gru"), (FLAT, True, 5, "lstm")])
def test_acting_carries_each_agents_state_and_resets_it_at_episode_ends(spec, comm, agents, core):
    """The evaluator acting step by step is the learner's network stepped from zeros, every agent of an env
    zeroed after its episode ended; the learner's fused `recurrent` over the steps agrees."""
    cfg = make_cfg(2, 4, 2, f"dhc.comm={comm}", "dhc.comm_rounds=2", "model.conv_channels=[8,4]",
                   "model.hidden=[8,4]", f"model.core={core}")
    algo = make_algorithm(cfg, with_agents(spec, agents))
    learner = perturbed_learner(algo)
    policy = algo.make_policy(-1, 1, 0)
    policy.set_weights(learner.get_weights(), 3)
    rng = np.random.default_rng(5)
    T, E = 7, 3
    steps = joint_obs(rng, (T, E), agents, spec)
    done, first = np.zeros((T, E), bool), np.zeros((T, E), bool)
    done[2, 1] = done[4, 0] = done[4, 2] = first[3, 1] = first[5, 0] = first[5, 2] = True
    state = torch.zeros(E, agents, 2 if core == "lstm" else 1, 16)
    assert policy.initial_state(E).shape == state.shape
    for t in range(T):
        obs = {k: v[t] for k, v in steps.items()}
        actions, extras = policy.act(obs, explore=True)
        with torch.no_grad():
            q_ref, after = learner.q.step({k: torch.as_tensor(v) for k, v in obs.items()}, state)
        np.testing.assert_array_equal(extras["q"], q_ref.numpy())
        np.testing.assert_array_equal(actions, q_ref.numpy().argmax(-1))  # the evaluator is greedy
        np.testing.assert_array_equal(extras["state"], state.numpy())
        assert extras["q"].dtype == np.float32 and actions.shape == (E, agents) and actions.dtype == np.int64
        policy.episodes_ended(done[t])
        state = after * torch.as_tensor(~done[t], dtype=torch.float32)[:, None, None, None]
    with torch.no_grad():
        out, final = learner.q.recurrent(torch.as_tensor(steps["obs"]), torch.zeros_like(state), torch.as_tensor(first))
        q = learner.q.q_values(out, torch.as_tensor(steps["comm_mask"]), torch.as_tensor(steps["active"]))
    np.testing.assert_allclose(q[-1].numpy(), extras["q"], rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(final.numpy(), after.numpy(), rtol=1e-5, atol=2e-5)


def test_policy_keeps_states_for_the_specs_agents_explores_per_agent_and_checks_specs():
    cfg = make_cfg()
    weights = make_algorithm(cfg, IMAGE).make_learner("cpu").get_weights()  # the learner's: any agent count
    for n in (2, 6):
        algo = make_algorithm(cfg, with_agents(IMAGE, n))
        policy = algo.make_policy(0, 1, 0)  # a lone worker at step 0: epsilon 1
        policy.set_weights(weights, 0)
        assert policy.initial_state(8).shape == (8, n, 1, 16)
        mask, active = random_masks(np.random.default_rng(n), (8,), n)
        actions, extras = policy.act({"obs": np.ones((8, n, 7, 5, 5), np.float32), "comm_mask": mask,
                                      "active": active}, explore=True)
        assert actions.shape == (8, n) and extras["state"].shape == (8, n, 1, 16) and not extras["state"].any()
        assert len(np.unique(actions)) > 1  # random per agent, not one action per env
    assert algo.make_policy(-1, 1, 0).epsilon == 0.0
    assert DHC.check_spec(IMAGE) is None and DHC.check_spec(FLAT) is None
    assert "Discrete" in DHC.check_spec(EnvSpec(FLAT.observation_space, spaces.Box(-1, 1, (2,))))
    assert "Box observation" in DHC.check_spec(EnvSpec(spaces.Discrete(3), spaces.Discrete(2)))
    # A 2-D observation is no image: the torso factory flattens it into an MLP.
    grid = make_algorithm(cfg, EnvSpec(spaces.Box(0, 1, (4, 4), np.float32), spaces.Discrete(2))).build_network()
    assert isinstance(grid.torso, MLPTorso)


# ------------------------------------------------------------------ the communication block


def comm_net(rounds=2):
    cfg = make_cfg(2, 4, 2, f"dhc.comm_rounds={rounds}", "dhc.comm_heads=2")
    torch.manual_seed(0)
    return make_algorithm(cfg, FLAT).build_network()


def communicate(net, h, mask, active):
    with torch.no_grad():
        return net.communicate(torch.as_tensor(h), torch.as_tensor(mask), torch.as_tensor(active)).numpy()


@pytest.mark.parametrize("rounds", [1, 2])
def test_attention_ignores_masked_and_inactive_agents_exactly(rounds):
    net = comm_net(rounds)
    n = 5
    h = np.random.default_rng(1).normal(size=(n, 16)).astype(np.float32)
    mask, active = np.zeros((n, n), bool), np.array([True, True, True, False, True])
    mask[0, [1, 2, 3]] = mask[1, 0] = mask[4, 0] = True  # 0 hears 1, 2 and 3 (inactive: never sends);
    # nobody hears 4; 4 hears 0 (one-way)
    # whose outputs agent j's features reach: in one round its hearers, in two also theirs (2 -> 0 -> 1, 4)
    reach = {0: {1, 4}, 1: {0}, 2: {0}, 3: set(), 4: set()} if rounds == 1 else \
        {0: {1, 4}, 1: {0, 4}, 2: {0, 1, 4}, 3: set(), 4: set()}
    base = communicate(net, h, mask, active)
    for j, affected in reach.items():
        h2 = h.copy()
        h2[j] += 3.0
        out = communicate(net, h2, mask, active)
        for i in set(range(n)) - {j}:
            if i in affected:  # the check bites: a heard agent does change the receiver's output
                assert np.abs(out[i] - base[i]).max() > 1e-3, (i, j)
            else:
                np.testing.assert_array_equal(out[i], base[i], err_msg=f"agent {j} leaked into {i}")


def test_empty_mask_rows_give_finite_outputs_and_no_message():
    net = comm_net()
    rng = np.random.default_rng(2)
    h = rng.normal(size=(3, 4, 16)).astype(np.float32)
    mask, active = np.zeros((3, 4, 4), bool), np.ones((3, 4), bool)
    mask[1, 0, 2], active[2] = True, False  # one message in the second group; every other row is empty
    out = communicate(net, h, mask, active)
    assert np.all(np.isfinite(out))
    silent = np.ones((3, 4), bool)
    silent[1, 0] = False  # every agent but agent 0 of group 1
    np.testing.assert_array_equal(out[silent], h[silent])  # no neighbour: h unchanged
    assert np.abs(out[1, 0] - h[1, 0]).max() > 1e-3
    ht = torch.as_tensor(h).requires_grad_(True)
    net.communicate(ht, torch.as_tensor(mask), torch.as_tensor(active)).sum().backward()
    assert torch.all(torch.isfinite(ht.grad))
    assert all(torch.all(torch.isfinite(p.grad)) for p in net.parameters() if p.grad is not None)


# ------------------------------------------------------------------ per-agent n-step targets


def reference_targets(values, rewards, discount, mask, valid, active, gamma, n, start, length):
    """Loops: sum an agent's rewards while it is active on real steps, bootstrap where it is active and stored."""
    _, B, N = rewards.shape
    out = np.zeros((length, B, N))
    for b, i, s in np.ndindex(B, N, length):
        t = start + s
        if not (mask[t, b] and active[t, b, i]):
            continue
        ret, scale, k = 0.0, 1.0, 0
        while k < n and mask[t + k, b] and active[t + k, b, i]:
            ret += scale * rewards[t + k, b, i]
            scale *= gamma * discount[t + k, b]
            k += 1
        out[s, b, i] = ret + scale * valid[t + k, b] * active[t + k, b, i] * values[t + k, b, i]
    return out


def test_agent_nstep_targets_inactive_agents_termination_truncation():
    """L = 7 (start 2, length 3, n 2), 2 items x 3 agents, rewards 1 where active, V = 10 (+ agent index).
    item 0 is truncated after step 3 (pseudo-step 4); item 1 terminates after step 4 (pseudo-step 5)."""
    L, B, N = 7, 2, 3
    mask, valid, discount = np.ones((L, B)), np.ones((L, B)), np.ones((L, B))
    mask[4:, 0], valid[5:, 0], mask[5:, 1], valid[6:, 1], discount[4, 1] = 0, 0, 0, 0, 0
    active = np.ones((L, B, N))
    active[3:, 0, 1] = active[4, 0, 2] = active[4:, 1, 0] = 0  # agents leave (asserts below say when)
    active *= valid[..., None]
    values = (10.0 + np.arange(N)) * np.ones((L, B, N))  # inactive agents have Q-values too: never used
    rewards = active * mask[..., None]
    out = agent_nstep_targets(values, rewards, discount, mask, valid, active, 0.5, 2, 2, 3)
    # item 0: agent 0 bootstraps from the pseudo-step; agent 1 leaves after step 2 (no bootstrap);
    # agent 2 is gone at the pseudo-step, so neither step 2 nor 3 has anything to bootstrap from.
    np.testing.assert_allclose(out[:, 0, 0], [1 + 0.5 + 0.25 * 10, 1 + 0.5 * 10, 0])
    np.testing.assert_allclose(out[:, 0, 1], [1, 0, 0])
    np.testing.assert_allclose(out[:, 0, 2], [1 + 0.5, 1, 0])
    # item 1: terminated after step 4: agent 1's step 3 sums two rewards and stops; agent 0 left after step 3.
    np.testing.assert_allclose(out[:, 1, 0], [1 + 0.5, 1, 0])
    np.testing.assert_allclose(out[:, 1, 1], [1 + 0.5 + 0.25 * 11, 1 + 0.5, 1])
    args = (values, rewards, discount, mask, valid, active, 0.5, 2, 2, 3)
    np.testing.assert_allclose(out, reference_targets(*args))
    as_t = [torch.as_tensor(a) for a in args[:6]]
    np.testing.assert_allclose(agent_nstep_targets(*as_t, 0.5, 2, 2, 3).numpy(), out)


def test_priorities_mix_max_and_mean_over_trained_step_agent_pairs():
    abs_td = np.array([[[1.0, 9.0], [4.0, 4.0]], [[3.0, 2.0], [0.0, 0.0]]])  # (step, item, agent)
    live = np.ones((2, 2, 2))
    live[0, 0, 1] = 0  # item 0's 9 is an inactive agent's: ignored
    np.testing.assert_allclose(agent_priorities(abs_td, live, 0.9), [0.9 * 3 + 0.1 * 2, 0.9 * 4 + 0.1 * 2])


# ------------------------------------------------------------------ the learner


def make_batch(rng, seq_len, batch, agents, first_at=(), obs_shape=(7, 5, 5), core=16, end=None):
    """A random time-major batch: item b's episode starts at first_at[b] (padding before it); item 0
    terminates after step `end` (pseudo-step, then padding); agents leave at random steps."""
    mask, first = np.ones((seq_len, batch), np.float32), np.zeros((seq_len, batch), bool)
    for b, t in enumerate(first_at):
        if t is not None:
            mask[:t, b], first[t, b] = 0.0, True
    valid, discount = mask.copy(), np.ones((seq_len, batch), np.float32)
    if end is not None:
        mask[end + 1:, 0], valid[end + 2:, 0], discount[end, 0] = 0.0, 0.0, 0.0
    active = (np.arange(seq_len)[:, None, None] < rng.integers(seq_len // 2, 2 * seq_len, (batch, agents))) \
        & (valid[..., None] > 0)
    trained = active & (mask[..., None] > 0)
    comm_mask, _ = random_masks(rng, (seq_len, batch), agents)
    state = rng.normal(size=(batch, agents, 1, core)).astype(np.float32) * ~first.any(axis=0)[:, None, None, None]
    obs = rng.random((seq_len, batch, agents, *obs_shape)).astype(np.float32)
    return {"obs": obs * active.reshape(*active.shape, *[1] * len(obs_shape)),
            "actions": rng.integers(0, 5, (seq_len, batch, agents)) * trained,
            "rewards": rng.normal(size=(seq_len, batch, agents)).astype(np.float32) * trained,
            "comm_mask": comm_mask & active[..., None] & active[..., None, :], "active": active,
            "discount": discount, "mask": mask, "valid": valid, "first": first, "state": state,
            "version": np.zeros(batch, np.int32), "weights": rng.uniform(0.5, 1.0, batch).astype(np.float32)}


@torch.no_grad()
def stepped(net, batch):
    """The reference: Q (L, B, N, A) from `net.step` in a Python loop from the stored state, zeroing it
    where `first`."""
    state, qs = torch.as_tensor(batch["state"]), []
    for t in range(len(batch["obs"])):
        state = state * torch.as_tensor(~batch["first"][t], dtype=torch.float32)[:, None, None, None]
        q, state = net.step({k: torch.as_tensor(batch[k][t]) for k in ("obs", "comm_mask", "active")}, state)
        qs.append(q.numpy())
    return np.stack(qs)


def reference_td(q, values, batch, gamma):
    """(the expected TD, which step-agent pairs train) at steps 2..5 of a burn-in-2, length-4, 2-step batch, from
    the online Q (T, B, N, A) and the bootstrap values (T, B, N) the reference picked."""
    active = batch["active"].astype(float)
    target = reference_targets(values, batch["rewards"], batch["discount"], batch["mask"], batch["valid"],
                               active, gamma, 2, 2, 4)
    q_taken = np.take_along_axis(q, batch["actions"][..., None], -1)[2:6, ..., 0]
    live = batch["mask"][2:6, :, None] * active[2:6]
    return (q_taken - target) * live, live


@pytest.mark.parametrize("double", [True, False])
def test_learner_td_matches_a_step_by_step_reference(double):
    learner = learner_for(make_cfg(2, 4, 2, f"dhc.double={double}"))
    with torch.no_grad():
        for p in learner.target.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    rng = np.random.default_rng(3)
    batch = make_batch(rng, 8, 5, 3, first_at=[None, 2, 1, None, 0], end=4)  # item 0 terminates after step 4
    q = stepped(learner.q, batch)
    qt = stepped(learner.target, batch)
    best = (q if double else qt).argmax(-1)[..., None]
    values = np.take_along_axis(qt, best, -1)[..., 0]
    expected_td, live = reference_td(q, values, batch, learner.cfg.gamma)
    loss, td, _, _ = learner.loss_and_td(tensors(batch))
    np.testing.assert_allclose(td.numpy() * live, expected_td, atol=3e-5)
    expected_loss = (0.5 * expected_td ** 2 * batch["weights"][:, None]).sum() / live.sum()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-4)
    out = update_once(learner, batch)
    np.testing.assert_allclose(out["priorities"], agent_priorities(np.abs(expected_td), live, 0.9), atol=3e-5)


def burn_in_gradients(learner, batch):
    t = tensors(batch)
    for k in ("obs", "state"):
        t[k].requires_grad_(True)
    learner.q.zero_grad(set_to_none=True)
    learner.loss_and_td(t)[0].backward()
    return t["obs"].grad, t["state"].grad, [p.grad.clone() for p in learner.q.parameters()]


def test_burn_in_gives_no_gradient(monkeypatch):
    learner = learner_for(make_cfg(4, 5, 2))
    batch = make_batch(np.random.default_rng(0), 11, 6, 3)
    batch["active"][:] = True  # every agent's observation takes part in the burn-in
    batch["obs"] = np.random.default_rng(1).random(batch["obs"].shape).astype(np.float32)
    obs_grad, state_grad, param_grads = burn_in_gradients(learner, batch)
    assert torch.all(obs_grad[:4] == 0) and state_grad is None
    assert obs_grad[4:].abs().max() > 0
    # Parameter gradients equal those of a learner without burn-in started from the burned-in state.
    ref = learner_for(make_cfg(0, 5, 2))
    ref.q.load_state_dict(learner.q.state_dict())
    ref.target.load_state_dict(learner.target.state_dict())
    with torch.no_grad():
        _, burned = learner.q.recurrent(torch.as_tensor(batch["obs"][:4]), torch.as_tensor(batch["state"]),
                                        torch.zeros(4, 6, dtype=torch.bool))
    sliced = {k: (v[4:] if v.ndim >= 2 and k != "state" else v) for k, v in batch.items()}
    sliced["state"] = burned.numpy()
    _, _, ref_grads = burn_in_gradients(ref, sliced)
    for g, r in zip(param_grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    # The check bites: with the burn-in unrolled under gradient (it does shape the trained Q), it gets some.
    monkeypatch.setattr(torch, "no_grad", contextlib.nullcontext)
    leaky_obs_grad, _, leaky = burn_in_gradients(learner, batch)
    assert leaky_obs_grad[:4].abs().max() > 0
    assert any(not torch.allclose(g, r) for g, r in zip(leaky, ref_grads))


def test_update_reduces_the_loss_and_returns_item_priorities():
    cfg = load_config(None, ["algo=dhc", "sequence.burn_in=2", "sequence.length=6", "dhc.n_step=3",
                             "dhc.lr=0.003", "dhc.target_update_interval=1000"])
    learner = learner_for(cfg)  # the default encoder, 64-unit GRU, communication on
    batch = make_batch(np.random.default_rng(1), 11, 16, 3, first_at=[2] * 4, core=64)
    batch["rewards"] = np.sign(batch["rewards"]) * batch["active"]
    losses = [update_once(learner, batch)["loss"] for _ in range(40)]
    out = update_once(learner, batch)
    assert out["priorities"].shape == (16,) and np.all(np.isfinite(out["priorities"]) & (out["priorities"] >= 0))
    assert np.mean(losses[-5:]) < 0.3 * losses[0] and out["grad_norm"] > 0 and learner.updates == 41
    with pytest.raises(ValueError, match="cfg.sequence"):
        update_once(learner, make_batch(np.random.default_rng(0), 10, 2, 3, core=64))


def test_state_dict_round_trip_resumes_identically():
    cfg = make_cfg(2, 4, 2, "dhc.target_update_interval=2")
    batches = [make_batch(np.random.default_rng(i), 8, 4, 3, first_at=[2, None, 1, None]) for i in range(4)]
    a = learner_for(cfg)
    for b in batches[:3]:
        update_once(a, b)
    b_ = learner_for(make_cfg(2, 4, 2, "dhc.target_update_interval=2", "seed=5"))
    b_.load_state_dict(a.state_dict())
    assert b_.updates == 3
    out_a, out_b = update_once(a, batches[3]), update_once(b_, batches[3])
    np.testing.assert_array_equal(out_a["priorities"], out_b["priorities"])
    assert out_a["loss"] == out_b["loss"]
    for net in ("q", "target"):
        for (k, v), w in zip(a.state_dict()[net].items(), b_.state_dict()[net].values()):
            torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)


# ------------------------------------------------------------------ postprocess -> SequenceReplay -> learner


def mapf_fragment(policy, envs, last, steps):
    """T steps of E MAPF envs acted on by `policy`, as the multi-agent rollout will; `last` is updated in place."""
    rows = []
    for _ in range(steps):
        before = {k: np.stack([getattr(s, k) for s in last]) for k in ("obs", "comm_mask", "active")}
        actions, extras = policy.act(before, explore=True)
        new = [env.step(a) for env, a in zip(envs, actions)]
        after = {k: np.stack([getattr(s, k) for s in new]) for k in (*before, "rewards", "terminated", "truncated")}
        rows.append({**before, **extras, "actions": actions, **{"next_" + k: after.pop(k) for k in before}, **after})
        done = rows[-1]["terminated"] | rows[-1]["truncated"]
        last[:] = [env.reset() if d else s for env, s, d in zip(envs, new, done)]
        policy.episodes_ended(done)
    arr = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    extras = {k: arr.pop(k) for k in ("q", "state", "comm_mask", "active", "next_comm_mask", "next_active")}
    return Trajectory(**arr, extras=extras)


@pytest.mark.parametrize("max_steps", [8, 2])
def test_postprocess_of_a_mapf_rollout_feeds_replay_masks_survive_and_priorities_match_the_learner(max_steps):
    """Random actions on a 3x3 map: episodes terminate, get truncated, agents leave mid-episode (and,
    with 2-step episodes, on a truncated episode's last step: no bootstrap from the final observation)."""
    from distrl.replay.sequence_replay import SequenceReplay

    cfg = make_cfg(3, 4, 2, "sequence.period=2", "sequence.chunk_length=4")
    learner = learner_for(cfg)  # target == online: both act as the worker's network
    policy = make_algorithm(cfg, with_agents(IMAGE, 3)).make_policy(0, 1, 7)
    policy.set_weights(learner.get_weights(), 0)
    envs = [MAPF(size=3, num_agents=3, density=0.0, fov=5, max_steps=max_steps, comm_k=1, remove_done_agents=True,
                 seed=e) for e in range(4)]  # epsilon 1: random actions
    last = [env.reset() for env in envs]
    trajs = [mapf_fragment(policy, envs, last, 1)] + [mapf_fragment(policy, envs, last, 12) for _ in range(3)]
    replay, worker = SequenceReplay(10_000, 3 + 4 + 2, prioritized=False), []
    for i, traj in enumerate(trajs):
        message, priorities = policy.postprocess(traj)
        assert priorities.shape == message["version"].shape and (i > 0 or len(priorities) == 0)
        replay.add(message, priorities)  # the first, empty message allocates nothing wrong
        worker.append(priorities)
    term, trunc = (np.concatenate([getattr(t, k) for t in trajs]) for k in ("terminated", "truncated"))
    leaves = np.concatenate([t.extras["active"] & ~t.extras["next_active"] for t in trajs])
    assert term.any() and trunc.any() and leaves.any() and (max_steps > 2 or (trunc[..., None] & leaves).any())
    assert len(replay) == sum(map(len, worker)) > 10 and replay.dropped_items == 0
    batches, idx, weights = replay.sample_many(1, 64)
    batch = {k: v[0] for k, v in batches.items()} | {"weights": weights[0]}
    check_masks_came_back(trajs, batch)
    out = update_once(learner, batch)
    np.testing.assert_allclose(out["priorities"], np.concatenate(worker)[idx[0]], rtol=1e-4, atol=1e-5)


def check_masks_came_back(trajs, batch):
    """Every sampled stored step's comm mask and active flags are the ones fed for that observation."""
    fed: dict[bytes, list] = {}
    for tr, pre in itertools.product(trajs, ("", "next_")):
        obs, cm, act = getattr(tr, pre + "obs"), tr.extras[pre + "comm_mask"], tr.extras[pre + "active"]
        for o, c, a in zip(obs.reshape(-1, *obs.shape[2:]), cm.reshape(-1, *cm.shape[2:]), act.reshape(-1, act.shape[-1])):
            fed.setdefault(o.astype(np.float32).tobytes(), []).append((c, a))
    stored = batch["valid"] == 1
    sampled = batch["comm_mask"][stored]
    assert sampled.any() and not np.array_equal(sampled, np.swapaxes(sampled, -1, -2)), "masks too plain to test"
    for o, c, a in zip(batch["obs"][stored], sampled, batch["active"][stored]):
        assert any(np.array_equal(c, fc) and np.array_equal(a, fa) for fc, fa in fed[o.tobytes()])
    assert not np.any(batch["comm_mask"][~stored]) and batch["comm_mask"].dtype == bool
