"""MAPPO's critic options: value normalization (a value head learning standardized returns, outputs kept as
the statistics move, a loss over standardized values) and the time left (the critic's input only, an episode
cut at the time limit ending there)."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from distrl.algos.actor_critic import time_major
from distrl.algos.mappo import TIME_KEY
from distrl.algos.value_norm import NormalizedValueHead
from distrl.config import load_config
from distrl.envs.multiagent_vector import MultiAgentVectorEnv
from distrl.roles.factory import make_algorithm
from distrl.roles.learning import update_once
from distrl.roles.rollout import Rollout

SPREAD = "mpe2:simple_spread_v3"
KWARGS = {"N": 3, "continuous_actions": False, "max_cycles": 10}


def make(*overrides):
    cfg = load_config(None, ["algo=mappo", f"env.id={SPREAD}", f"env.kwargs={KWARGS}", "model.hidden=[16]",
                             *overrides])
    return make_algorithm(cfg)


def head(seed=0) -> NormalizedValueHead:
    torch.manual_seed(seed)
    return NormalizedValueHead(nn.Linear(4, 1))


def test_value_normalization_keeps_the_heads_outputs_as_its_statistics_move():
    h, x = head(), torch.randn(32, 4)
    with torch.no_grad():
        before = h(x)
    assert h.mean.item() == 0.0 and h.std.item() == 1.0  # before any returns: the plain linear layer
    rng = np.random.default_rng(0)
    for _ in range(5):
        h.update(torch.as_tensor(rng.normal(-20.0, 4.0, 256), dtype=torch.float32))
        with torch.no_grad():
            torch.testing.assert_close(h(x), before, rtol=1e-5, atol=1e-4)
    assert -21.0 < h.mean.item() < -19.0 and 3.5 < h.std.item() < 4.5


def test_value_normalization_round_trips_and_standardizes_the_first_batch_exactly():
    h = head()
    returns = torch.tensor([-30.0, -25.0, -20.0, -15.0, 100.0, 100.0])
    live = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])  # departed agents' rows: not in the statistics
    h.update(returns, live)
    z = h.normalize(returns[:4])
    assert z.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert z.square().mean().item() == pytest.approx(1.0, rel=1e-5)
    torch.testing.assert_close(z * h.std + h.mean, returns[:4])
    mean, std = h.mean.clone(), h.std.clone()
    h.update(returns, torch.zeros(6))  # no live row: nothing moves
    assert h.mean.item() == mean.item() and h.std.item() == std.item()


def test_the_value_loss_compares_standardized_values_and_returns():
    algo = make("mappo.value_norm=true", "mappo.vf_coef=1.0")
    learner = algo.make_learner("cpu")
    v_head = learner.net.v_head
    assert isinstance(v_head, NormalizedValueHead) and isinstance(make().make_learner("cpu").net.v_head, nn.Linear)
    policy = algo.make_policy(0, 1, 0)
    policy.set_weights(learner.get_weights(), 0)  # the statistics travel with the weights
    data = Rollout(policy, MultiAgentVectorEnv(SPREAD, 2, 0, KWARGS), 10, 0).sample().data
    t = time_major(data, "cpu")
    adv, returns, est, _ = learner.targets(t)  # updates the statistics from these returns
    assert v_head.weight.item() > 0 and v_head.mean.item() < 0  # simple_spread's returns are negative
    rows = {"obs": {k: v.flatten(0, 1) for k, v in t["obs"].items()}, "actions": t["actions"].flatten(),
            "old_logp": t["logp"].flatten(), "adv": adv.flatten(), "old_values": est.values.flatten(),
            "returns": returns.flatten(), "live": t["live"].flatten()}
    _, terms, _ = learner.sample_loss(rows)
    with torch.no_grad():
        _, _, values = learner.net.evaluate(rows["obs"], rows["actions"])
    standardized = ((values - returns.flatten()) / v_head.std).square().mean() * 0.5
    assert terms["loss_value"].item() == pytest.approx(standardized.item(), rel=1e-5)
    assert v_head.std.item() > 1.5  # so the loss in the env's units would have been larger by std^2
    assert math.isfinite(update_once(learner, data)["loss"])


def test_the_time_left_reaches_the_critic_only_and_an_episode_cut_at_the_limit_ends_there():
    from distrl.models.export import acting_network, example_batch, onnx_bytes
    import onnxruntime as ort

    algo = make("mappo.time_limit=10", "mappo.value_norm=true")
    learner = algo.make_learner("cpu")
    assert learner.net.v_torso.keys == ("joint", "agent", TIME_KEY) and learner.net.pi_torso.keys == ("own", "agent")
    assert make("mappo.time_limit=10", "mappo.critic=local").critic_keys == ("own", "agent", TIME_KEY)
    policy = algo.make_policy(0, 1, 0)
    policy.set_weights(learner.get_weights(), 0)
    assert set(policy.acting_space) == {"own", "agent"}
    session = ort.InferenceSession(onnx_bytes(acting_network(policy), example_batch(policy.acting_space)))
    assert [i.name for i in session.get_inputs()] == ["agent", "own"]  # the exported actor: no time
    rollout = Rollout(policy, MultiAgentVectorEnv(SPREAD, 2, 0, KWARGS), 12, 0)  # episodes of 10 steps
    first, second = rollout.sample().data, rollout.sample().data
    left = np.round(1.0 - np.arange(10) / 10, 6)
    np.testing.assert_allclose(first["obs"][TIME_KEY][:, :, 0], np.tile(np.r_[left, left[:2]][:, None], (1, 6)))
    np.testing.assert_allclose(second["obs"][TIME_KEY][:, 0, 0], np.r_[left[2:], left[:4]])
    np.testing.assert_allclose(first["next_obs"][TIME_KEY][9, :, 0], 0.0)
    ended = np.zeros(12, bool)
    ended[9] = True  # the cut at the limit is the episode's end: no bootstrap from it
    assert (first["terminated"] == ended[:, None]).all() and not first["truncated"].any()
    assert math.isfinite(update_once(learner, first)["loss"])
