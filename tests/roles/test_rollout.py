import os

import numpy as np

from distrl.config import load_config
from distrl.envs import VectorEnv
from distrl.roles.factory import make_algorithm, policy_seed
from distrl.roles.factory import make_rollout as real_rollout
from distrl.roles.rollout import Rollout


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_rollout(seed=0, worker=0, num_envs=4, T=64):
    cfg = load_config(None, [f"seed={seed}"])  # Ape-X DQN on CartPole
    algo = make_algorithm(cfg)
    policy = algo.make_policy(worker, 2, policy_seed(cfg.seed, worker))
    learner = algo.make_learner("cpu")
    policy.set_weights(learner.get_weights(), 0)
    return Rollout(policy, VectorEnv("CartPole-v1", num_envs, seed + worker), T, worker)


def test_fragment_is_one_dict_of_arrays_tagged_with_worker_and_version():
    frag = make_rollout(worker=1).sample()
    assert frag.info.worker == 1 and frag.info.version == 0
    assert frag.info.env_steps == 4 * 64
    n = 4 * 64
    assert set(frag.data) == {"obs", "actions", "rewards", "next_obs", "discounts", "version"}
    assert all(isinstance(v, np.ndarray) and len(v) == n for v in frag.data.values())
    assert frag.data["obs"].dtype == np.float32 and frag.priorities.shape == (n,)
    assert len(frag.info.episode_returns) > 0  # random-ish CartPole episodes are short


def test_episode_ends_keep_the_true_final_observation():
    r = make_rollout(T=64)
    frag = r.sample()
    # discount 0 marks a termination; its bootstrap obs must be a terminal CartPole state
    # (pole angle or cart position out of bounds), never a fresh reset state.
    done = frag.data["discounts"] == 0
    assert done.any()
    final = frag.data["next_obs"][done]
    out_of_bounds = (np.abs(final[:, 0]) > 2.4) | (np.abs(final[:, 2]) > 0.2095)
    assert out_of_bounds.all()


def test_same_seed_same_fragment_and_workers_differ():
    a, b, c = make_rollout(seed=3), make_rollout(seed=3), make_rollout(seed=3, worker=1)
    fa, fb, fc = a.sample(), b.sample(), c.sample()
    for k in fa.data:
        np.testing.assert_array_equal(fa.data[k], fb.data[k])
    assert not np.array_equal(fa.data["obs"], fc.data["obs"])


def test_a_worker_normalizes_with_the_statistics_its_weights_came_with_and_hands_out_raw_rows():
    from distrl.envs.normalize import EPSILON, RunningStats, SharedStatistics

    cfg = load_config(os.path.join(ROOT, "configs", "ppo_cartpole.yaml"),
                      ["env.id=Pendulum-v1", "env.num_envs=2", "rollout.fragment_length=4", "env.normalize.obs=true"])
    algo = make_algorithm(cfg)
    policy = algo.make_policy(0, 1, 0)
    weights = algo.make_learner("cpu").get_weights()
    shift = SharedStatistics()
    shift.merge({"obs": RunningStats(10, [5.0, -5.0, 2.0], [40.0, 40.0, 90.0])})
    policy.set_weights({**weights, **shift.arrays()}, 1)
    rollout = real_rollout(cfg, policy, cfg.seed, 0)
    raw = VectorEnv("Pendulum-v1", 2, cfg.seed)  # the same envs, unnormalized
    frag = rollout.sample()
    o = shift.parts["obs"]
    first = frag.data["obs"].reshape(4, 2, 3)[0]
    np.testing.assert_allclose(first[1], (raw.obs[1] - o.mean) / np.sqrt(o.var + EPSILON), rtol=1e-5)
    assert frag.info.statistics["obs"].count == 4 * 2 + 2  # the raw rows: steps, and the first resets
    assert "ret" not in frag.info.statistics
    assert rollout.sample().info.statistics["obs"].count == 4 * 2  # each row handed out once
