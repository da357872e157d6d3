"""R2D2's learner: TD errors against a step-by-step reference, burn-in without gradient, updates,
state round trip; and worker fragments through sequence replay into the learner."""
import contextlib

import numpy as np
import pytest
import torch

from distrl.algos.r2d2_acting import rescale, sequence_priorities, unrescale
from distrl.config import load_config
from distrl.roles.factory import make_algorithm
from distrl.roles.learning import update_once
from tests.algos.test_r2d2_acting import SPEC, make_cfg, reference_targets


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
    return make_algorithm(cfg, SPEC).make_learner("cpu")


# ------------------------------------------------------------------ the learner


@torch.no_grad()
def stepped(net, obs, state, first, final_state=False):
    """The reference: Q (L, B, A) from `net.step` in a Python loop from `state`, zeroing it where `first`
    (and the state after the last step, if asked)."""
    state, qs = torch.as_tensor(state), []
    for t in range(len(obs)):
        state = state * torch.as_tensor(~first[t], dtype=torch.float32)[:, None, None]
        q, state = net.step(torch.as_tensor(obs[t]), state)
        qs.append(q.numpy())
    return (np.stack(qs), state.numpy()) if final_state else np.stack(qs)


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_the_fused_unroll_with_resets_is_the_step_by_step_network(core):
    """`unroll` runs the core over the segments between resets (`first`), several rows resetting at
    different steps, one row twice; its head is the Q of `step` in a loop."""
    net = learner_for(make_cfg(2, 4, 2, f"model.core={core}")).q
    rng = np.random.default_rng(0)
    T, B = 9, 4
    obs = rng.normal(size=(T, B, 3)).astype(np.float32)
    state = rng.normal(size=(B, 2 if core == "lstm" else 1, 8)).astype(np.float32)
    first = np.zeros((T, B), bool)
    first[3, 0] = first[3, 2] = first[6, 2] = first[0, 3] = True
    with torch.no_grad():
        out, final = net.unroll(torch.as_tensor(obs), torch.as_tensor(state), torch.as_tensor(first))
        q = net.head(out).numpy()
    ref_q, ref_final = stepped(net, obs, state, first, final_state=True)
    np.testing.assert_allclose(q, ref_q, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(final.numpy(), ref_final, rtol=1e-5, atol=1e-6)
    assert final.shape == state.shape
    # Row 3 reset at step 0: its stored state played no part.
    np.testing.assert_allclose(q[:, 3], stepped(net, obs, np.zeros_like(state), first)[:, 3], rtol=1e-5, atol=1e-6)
    # The torso runs over any leading axes.
    assert net.features(torch.as_tensor(obs)).shape == (T, B, 16)


@pytest.mark.parametrize("core,double,rescaling", [("lstm", True, True), ("gru", False, False)])
def test_learner_td_matches_a_step_by_step_reference(core, double, rescaling):
    cfg = make_cfg(2, 4, 2, f"model.core={core}", f"r2d2.double={double}", f"r2d2.value_rescaling={rescaling}")
    learner = learner_for(cfg)
    with torch.no_grad():
        for p in learner.target.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    rng = np.random.default_rng(3)
    batch = make_batch(rng, 8, 5, (2 if core == "lstm" else 1, 8), first_at=[None, 2, 1, None, 0])
    batch["discount"][3, 0] = 0.0  # item 0 terminates at step 3 ...
    batch["mask"][4:, 0] = batch["valid"][5:, 0] = 0.0  # ... then its pseudo-step, then padding (trained, unreal)
    q = stepped(learner.q, batch["obs"], batch["state"], batch["first"])
    qt = stepped(learner.target, batch["obs"], batch["state"], batch["first"])
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
    out = update_once(learner, batch)
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
        _, burned = learner.q.unroll(torch.as_tensor(batch["obs"][:4]), torch.as_tensor(batch["state"]),
                                     torch.as_tensor(batch["first"][:4]))
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
    losses = [update_once(learner, batch)["loss"] for _ in range(40)]
    out = update_once(learner, batch)
    assert out["priorities"].shape == (16,) and np.all(np.isfinite(out["priorities"]))
    assert np.all(out["priorities"] >= 0) and out["grad_norm"] > 0
    assert np.mean(losses[-5:]) < 0.3 * losses[0]
    assert learner.updates == 41


def test_learner_rejects_sequences_of_another_length():
    learner = learner_for(make_cfg(2, 4, 2))
    with pytest.raises(ValueError, match="cfg.sequence"):
        update_once(learner, make_batch(np.random.default_rng(0), 9, 2, (2, 8)))


def test_state_dict_round_trip_resumes_identically():
    cfg = make_cfg(2, 4, 2, "r2d2.target_update_interval=2")
    rng = np.random.default_rng(2)
    batches = [make_batch(rng, 8, 4, (2, 8), first_at=[2, None, 1, None]) for _ in range(4)]
    a = learner_for(cfg)
    for b in batches[:3]:
        update_once(a, b)
    b_ = learner_for(make_cfg(2, 4, 2, "r2d2.target_update_interval=2", "seed=5"))
    b_.load_state_dict(a.state_dict())
    assert b_.updates == 3
    out_a, out_b = update_once(a, batches[3]), update_once(b_, batches[3])
    np.testing.assert_array_equal(out_a["priorities"], out_b["priorities"])
    assert out_a["loss"] == out_b["loss"]
    for (k, v), w in zip(a.state_dict()["target"].items(), b_.state_dict()["target"].values()):
        torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)
    for k, v in a.get_weights().items():
        np.testing.assert_array_equal(v, b_.get_weights()[k])


# ------------------------------------------------------------------ postprocess -> SequenceReplay -> learner


def rollout_fragments(cfg, spec, learner, fragment_length, count, env_kwargs):
    from distrl.envs import VectorEnv
    from distrl.roles.rollout import Rollout

    policy = make_algorithm(cfg, spec).make_policy(0, 1, 7)
    policy.set_weights(learner.get_weights(), 0)
    rollout = Rollout(policy, VectorEnv("CartPole-v1", 3, 0, env_kwargs), fragment_length, 0)
    return [rollout.sample() for _ in range(count)]


def test_postprocess_feeds_sequence_replay_and_worker_priorities_match_the_learner():
    replay_module = pytest.importorskip("distrl.replay.sequence_replay")
    from distrl.envs import env_spec

    kwargs = {"max_episode_steps": 16}  # random CartPole: episodes both terminate and get truncated
    cfg = load_config(None, ["algo=r2d2", "sequence.burn_in=4", "sequence.length=6", "sequence.period=3",
                             "sequence.chunk_length=4", "r2d2.n_step=3", "model.hidden=[16]", "model.core_size=8"])
    spec = env_spec("CartPole-v1", kwargs)
    learner = make_algorithm(cfg, spec).make_learner("cpu")  # target == online: both act as the worker's network
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
    out = update_once(learner, batch)
    # Same weights, same stored states: the learner's TD errors are the worker's (incl. the pseudo-step's Q).
    worker = np.concatenate([f.priorities for f in frags])
    np.testing.assert_allclose(out["priorities"], worker[idx[0]], rtol=1e-4, atol=1e-5)


def test_a_fragment_without_items_sends_an_empty_message_shaped_like_a_real_one():
    replay_module = pytest.importorskip("distrl.replay.sequence_replay")
    from distrl.envs import env_spec

    cfg = load_config(None, ["algo=r2d2", "model.hidden=[16]", "model.core_size=8"])
    spec = env_spec("CartPole-v1")
    learner = make_algorithm(cfg, spec).make_learner("cpu")
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


def test_uint8_frames_learn_as_their_float_frames():
    """Image sequences stay uint8 up to the learner; its torso scales them exactly as a float32 batch of
    frames / 255 would be, so the TD errors are the same floats."""
    from gymnasium import spaces

    from distrl.core import EnvSpec

    cfg = make_cfg(2, 4, 2, "model.features=16")
    byte_spec = EnvSpec(spaces.Box(0, 255, (2, 6, 6), np.uint8), SPEC.action_space)
    float_spec = EnvSpec(spaces.Box(0.0, 1.0, (2, 6, 6), np.float32), SPEC.action_space)
    on_bytes = make_algorithm(cfg, byte_spec).make_learner("cpu")
    on_floats = make_algorithm(cfg, float_spec).make_learner("cpu")
    on_floats.load_state_dict(on_bytes.state_dict())
    batch = make_batch(np.random.default_rng(4), 8, 3, (2, 8), first_at=[None, 2, 0])
    frames = np.random.default_rng(5).integers(0, 256, (8, 3, 2, 6, 6), dtype=np.uint8)
    loss_b, td_b, _ = on_bytes.loss_and_td({k: torch.as_tensor(v) for k, v in dict(batch, obs=frames).items()})
    floats = dict(batch, obs=frames.astype(np.float32) / 255)
    loss_f, td_f, _ = on_floats.loss_and_td({k: torch.as_tensor(v) for k, v in floats.items()})
    assert torch.equal(td_b, td_f) and torch.equal(loss_b, loss_f)
    assert np.isfinite(update_once(on_bytes, dict(batch, obs=frames))["loss"])


def test_a_dict_observation_s_mask_rules_actions_out_of_the_targets_max_and_replay_s_columns_rebuild_it():
    """Dict{x, action_mask}: the learner takes the columns sequence replay sends (`obs.x`,
    `obs.action_mask`), and its targets bootstrap from the best legal action, as a step-by-step reference
    with masked Q-values does; a masked action's Q is MASKED in every step."""
    from gymnasium import spaces

    from distrl.core import EnvSpec
    from distrl.sampling import MASKED

    spec = EnvSpec(spaces.Dict({"x": spaces.Box(-1.0, 1.0, (3,), np.float32), "action_mask": spaces.MultiBinary(3)}),
                   spaces.Discrete(3))
    cfg = make_cfg(2, 4, 2, "r2d2.double=false", "r2d2.value_rescaling=false")
    learner = make_algorithm(cfg, spec).make_learner("cpu")
    rng = np.random.default_rng(5)
    batch = make_batch(rng, 8, 6, (2, 8), first_at=[None, 1, None, 0, None, None])
    mask = (rng.random((8, 6, 3)) < 0.5).astype(np.int8)
    mask[np.arange(8)[:, None], np.arange(6), batch["actions"]] = 1  # the actions taken were legal
    columns = {**{k: v for k, v in batch.items() if k != "obs"}, "obs.x": batch["obs"], "obs.action_mask": mask}
    obs = {"x": batch["obs"], "action_mask": mask}

    def masked_stepped(net):
        state, qs = torch.as_tensor(batch["state"]), []
        with torch.no_grad():
            for t in range(8):
                state = state * torch.as_tensor(~batch["first"][t], dtype=torch.float32)[:, None, None]
                q, state = net.step({k: torch.as_tensor(v[t]) for k, v in obs.items()}, state)
                qs.append(q.numpy())
        return np.stack(qs)

    q, qt = masked_stepped(learner.q), masked_stepped(learner.target)
    assert np.all(q[mask == 0] == MASKED) and np.all(q[mask == 1] > MASKED / 2)
    values = np.where(mask.any(-1), qt.max(-1), 0.0) * batch["valid"]  # the best legal action's value
    target = reference_targets(values, batch["rewards"], batch["discount"], batch["mask"], batch["valid"],
                               learner.cfg.gamma, 2, 2, 4)
    q_taken = np.take_along_axis(q, batch["actions"][..., None], -1)[2:6, :, 0]
    expected_td = (q_taken - target) * batch["mask"][2:6]
    out = update_once(learner, columns)
    np.testing.assert_allclose(out["priorities"], sequence_priorities(np.abs(expected_td), batch["mask"][2:6], 0.9),
                               atol=2e-5)
