"""The evaluator's best checkpoint: ranked by success rate before return, it only improves, and only the
driver writes it (the evaluator hands back the weights of a new best)."""
import json
import os

import numpy as np

from distrl.checkpoint import save_json
from distrl.config import load_config
from distrl.roles.evaluation import LOWEST, make_evaluation, rank, save_best, saved_rank

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def result(ret, success=None):
    metrics = {} if success is None else {"success_rate": success}
    return {"return_mean": ret, "metrics": metrics}


def test_success_rate_outranks_return_where_the_env_reports_one():
    assert rank(result(-20.0, success=0.9)) > rank(result(-5.0, success=0.8))
    assert rank(result(-5.0, success=0.9)) > rank(result(-20.0, success=0.9))
    assert rank(result(200.0)) > rank(result(100.0))


def test_a_resumed_run_starts_from_the_saved_best(tmp_path):
    os.makedirs(tmp_path / "checkpoints")
    assert saved_rank(str(tmp_path)) == LOWEST
    save_json(os.path.join(tmp_path, "checkpoints", "best.json"), result(-7.0, success=0.85))
    assert saved_rank(str(tmp_path)) == (0.85, -7.0)
    with open(tmp_path / "checkpoints" / "best.json", "w") as fh:
        json.dump({"return_mean": float("nan"), "metrics": {}}, fh)
    assert saved_rank(str(tmp_path)) == LOWEST
    with open(tmp_path / "checkpoints" / "best.json", "w") as fh:
        fh.write("{half")
    assert saved_rank(str(tmp_path)) == LOWEST


def test_without_a_readable_best_json_the_rank_comes_from_the_weights_file(tmp_path):
    save_best(str(tmp_path), {"w": np.ones(3, np.float32)}, result(120.0))
    os.remove(tmp_path / "checkpoints" / "best.json")  # a kill between the two writes
    assert saved_rank(str(tmp_path)) == (-np.inf, 120.0)


def test_an_evaluation_hands_back_weights_only_when_it_beats_the_best_it_knows():
    cfg = load_config(os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml"), ["eval.episodes=2"])
    from distrl.roles.factory import make_algorithm

    weights = make_algorithm(cfg).make_learner("cpu").get_weights()
    evaluation = make_evaluation(cfg, start_time=0.0, resume={"evaluations": 0, "best": (-np.inf, 1e9)})
    assert "weights" not in evaluation.evaluate(weights, 0)  # nothing reaches a return of 1e9
    evaluation = make_evaluation(cfg, start_time=0.0)
    first = evaluation.evaluate(weights, 0)
    assert set(first["weights"]) == set(weights)
    assert all(np.array_equal(first["weights"][k], weights[k]) for k in weights)
    again = evaluation.evaluate(weights, 0)  # other seeds, the same weights: kept only if better
    assert ("weights" in again) == (rank(again) > rank(first))


def test_workers_envs_get_the_train_only_wrappers_and_the_evaluators_envs_do_not():
    from distrl.roles.factory import acting_policy, make_algorithm, make_rollout

    cfg = load_config(os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml"), ["eval.episodes=2", "env.num_envs=2"])
    cfg.env.wrappers = [{"tests.envs.test_wrappers:ScaleReward": {"factor": 0.0}, "train_only": True}]
    rollout = make_rollout(cfg, acting_policy(cfg, 0, 1), seed=0, worker_index=0)
    assert rollout.envs.step(np.zeros(2, np.int64))[1].tolist() == [0.0, 0.0]
    weights = make_algorithm(cfg).make_learner("cpu").get_weights()
    assert make_evaluation(cfg, start_time=0.0).evaluate(weights, 0)["return_mean"] >= 8  # CartPole: 1 a step


def test_eval_epsilon_replaces_a_share_of_the_greedy_actions_with_uniform_random_ones():
    from gymnasium import spaces

    from distrl.roles.evaluation import with_random_actions

    greedy = np.zeros(4000, np.int64)
    assert with_random_actions(greedy, 0.0, spaces.Discrete(4), np.random.default_rng(0)) is greedy
    mixed = with_random_actions(greedy, 0.25, spaces.Discrete(4), np.random.default_rng(0))
    assert set(np.unique(mixed)) == {0, 1, 2, 3}
    assert 0.16 < (mixed != 0).mean() < 0.22  # 1/4 swapped, 3/4 of those to another action


def test_eval_epsilon_s_random_actions_are_legal_ones_where_the_observation_has_a_mask():
    from gymnasium import spaces

    from distrl.roles.evaluation import with_random_actions

    rng = np.random.default_rng(1)
    mask = (rng.random((3000, 5)) < 0.4).astype(np.int8)
    mask[:, 4] = 1
    got = with_random_actions(np.full(3000, 4), 1.0, spaces.Discrete(5), rng, mask)
    assert mask[np.arange(3000), got].all()
    assert np.unique(got[mask[:, 0] == 1]).tolist() == [0, 1, 2, 3, 4]  # uniform among the legal: each drawn
    # MultiDiscrete([3, 2]): the mask is factor 0's 3 entries then factor 1's 2; factor 1 may only take 1
    factored = np.tile(np.array([1, 0, 1, 0, 1], np.int8), (2000, 1))
    got = with_random_actions(np.zeros((2000, 2), np.int64), 1.0, spaces.MultiDiscrete([3, 2]), rng, factored)
    assert set(got[:, 0].tolist()) == {0, 2} and set(got[:, 1].tolist()) == {1}


def test_an_evaluation_with_eval_epsilon_one_plays_uniform_random_actions():
    """Zero weights: every Q-value ties, so greedy CartPole pushes one way and falls in ~10 steps; uniform
    random actions keep it up about twice as long."""
    from distrl.roles.factory import make_algorithm

    path = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
    weights = {k: np.zeros_like(v) for k, v in make_algorithm(load_config(path)).make_learner("cpu").get_weights().items()}
    means = [make_evaluation(load_config(path, [f"eval.epsilon={eps}"]), start_time=0.0).evaluate(weights, 0)["return_mean"]
             for eps in (0.0, 1.0)]
    assert means[0] < 12 < 16 < means[1], means
