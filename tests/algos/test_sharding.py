"""Gradient workers: one sharded update equals a single learner's update on the whole batch."""
import copy

import numpy as np
import pytest
import torch

from distrl.algos.sharding import ShardGradient, combine, local_gradient_fn, split_rows
from distrl.config import load_config
from distrl.envs import VectorEnv, env_spec
from distrl.roles.factory import make_algorithm, policy_seed
from distrl.roles.rollout import Rollout
from distrl.roles.learning import update_once

CONFIGS = {"apex_dqn": "configs/apex_dqn_cartpole.yaml", "impala": "configs/impala_cartpole.yaml",
           "ppo": "configs/ppo_cartpole.yaml",
           "ppo_lstm": "configs/ppo_lstm_position_only_cartpole.yaml",  # shards of whole sequences
           # an image torso: its Linear weight is input-major in memory (models/torsos.input_major_)
           "apex_dqn_minatar": "configs/apex_dqn_minatar_breakout.yaml", "ppo_minatar": "configs/ppo_minatar_breakout.yaml"}


def learner_and_batch(algo: str, seed: int = 0):
    cfg = load_config(CONFIGS[algo], [f"seed={seed}"])
    algorithm = make_algorithm(cfg, env_spec(cfg.env.id))
    learner = algorithm.make_learner("cpu")
    policy = algorithm.make_policy(0, 1, policy_seed(cfg.seed, 0))
    policy.set_weights(learner.get_weights(), 0)
    frag = Rollout(policy, VectorEnv(cfg.env.id, 8, seed), 32, 0).sample()
    batch = dict(frag.data)
    if algo.startswith("apex_dqn"):  # a prioritized replay batch: importance weights with it
        batch["weights"] = np.random.default_rng(seed).uniform(0.2, 1.0, len(batch["obs"])).astype(np.float32)
    return algorithm, learner, batch


def params(learner):
    return [p.detach().clone() for p in learner.trained_module().parameters()]


@pytest.mark.parametrize("algo", ["apex_dqn", "impala", "ppo", "apex_dqn_minatar", "ppo_minatar", "ppo_lstm"])
@pytest.mark.parametrize("k", [2, 3])
def test_an_update_with_k_gradient_workers_equals_one_learner_on_the_whole_batch(algo, k):
    algorithm, single, batch = learner_and_batch(algo)
    sharded = copy.deepcopy(single)
    replicas = [algorithm.make_learner("cpu") for _ in range(k)]  # their own weights: overwritten per step
    sharded.use_gradient_workers(local_gradient_fn(replicas), k)
    torch.manual_seed(1)
    out_single = update_once(single, batch)
    torch.manual_seed(1)  # PPO shuffles its minibatches: the same order for both
    out_sharded = update_once(sharded, batch)
    before = params(learner_and_batch(algo)[1])
    for a, b, p0 in zip(params(single), params(sharded), before):
        assert not torch.equal(a, p0)  # the update moved the weights
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert single.opt.state_dict()["state"].keys() == sharded.opt.state_dict()["state"].keys()
    assert out_single["loss"] == pytest.approx(out_sharded["loss"], rel=1e-5, abs=1e-6)
    assert out_single["grad_norm"] == pytest.approx(out_sharded["grad_norm"], rel=1e-4)
    if algo.startswith("apex_dqn"):
        np.testing.assert_allclose(out_single["priorities"], out_sharded["priorities"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ["apex_dqn", "impala", "ppo"])
def test_one_gradient_worker_is_the_single_learner_exactly(algo):
    """K = 1 (the default) changes nothing: bit for bit the single learner's weights, optimizer state and
    outputs after an update on the same batch."""
    algorithm, single, batch = learner_and_batch(algo)
    one = copy.deepcopy(single)
    one.use_gradient_workers(local_gradient_fn([algorithm.make_learner("cpu")]), 1)
    torch.manual_seed(1)
    out_single = update_once(single, batch)
    torch.manual_seed(1)
    out_one = update_once(one, batch)
    before = params(learner_and_batch(algo)[1])
    for a, b, p0 in zip(params(single), params(one), before):
        assert not torch.equal(a, p0)  # the update moved the weights
        assert torch.equal(a, b)
    state, state_one = single.opt.state_dict()["state"], one.opt.state_dict()["state"]
    assert state.keys() == state_one.keys() and state
    for i in state:
        assert state[i].keys() == state_one[i].keys()
        for name, value in state[i].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state_one[i][name])), (i, name)
    assert out_single.keys() == out_one.keys()
    for key, value in out_single.items():
        np.testing.assert_array_equal(np.asarray(out_one[key]), np.asarray(value), err_msg=key)


def test_shards_cover_every_row_once_and_weights_follow_their_rows():
    samples = {"x": np.arange(10), "y": np.arange(10) * 2}
    shards = split_rows(samples, 3)
    assert [len(s["x"]) for s in shards] == [3, 4, 3]
    np.testing.assert_array_equal(np.concatenate([s["y"] for s in shards]), samples["y"])
    assert len(split_rows(samples, 20)) == 10
    grads, loss, terms, per_row = combine([ShardGradient(1, [np.array([4.0])], 4.0, {"q": 1.0}, {"td": np.array([1])}),
                                           ShardGradient(3, [np.array([0.0])], 0.0, {"q": 3.0}, {"td": np.array([2, 3, 4])})])
    assert grads[0][0] == 1.0 and loss == 1.0 and terms["q"] == 2.5
    np.testing.assert_array_equal(per_row["td"], [1, 2, 3, 4])


def test_a_nonfinite_shard_skips_the_whole_step():
    algorithm, learner, batch = learner_and_batch("impala")
    replicas = [algorithm.make_learner("cpu") for _ in range(2)]
    learner.use_gradient_workers(local_gradient_fn(replicas), 2)
    batch["rewards"] = batch["rewards"].copy()
    batch["rewards"][-1, -1] = np.nan  # poisons the V-trace targets of one env column, in both shards
    before = params(learner)
    out = update_once(learner, batch)
    assert out.get("nonfinite") == 1 and learner.updates == 0
    for a, b in zip(before, params(learner)):
        assert torch.equal(a, b)
