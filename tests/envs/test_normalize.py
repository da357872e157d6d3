"""env.normalize: exact merges of running statistics, the wrappers that normalize with them, and the
evaluator's frozen use of them."""
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl.config.sections import NormalizeConfig
from distrl.envs import VectorEnv, make_env
from distrl.envs.normalize import (EPSILON, RAW_REWARD, Normalization, RunningStats, SharedStatistics, merged,
                                   network_weights, normalization_for)

BOTH = NormalizeConfig(obs=True, reward=True, clip=10.0, gamma=0.9)


def assert_same_stats(a: RunningStats, b: RunningStats):
    assert a.count == b.count
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a.m2, b.m2, rtol=1e-10, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_merging_the_parts_equals_one_pass_over_all_rows(sizes, seed):
    rng = np.random.default_rng(seed)
    parts = [rng.normal(rng.uniform(-50, 50), rng.uniform(0.1, 20), (n, 3)) for n in sizes]
    total = SharedStatistics()
    for p in parts:  # as the learner gets them: each fragment's statistics, one merge at a time
        total.merge({"obs": RunningStats.of(p)} if len(p) else None)
    rows = np.concatenate(parts)
    if len(rows) == 0:
        assert total.parts == {}
        return
    assert_same_stats(total.parts["obs"], RunningStats.of(rows))
    np.testing.assert_allclose(total.parts["obs"].var, rows.var(0), rtol=1e-10)
    # The driver's pre-merge of several fragments, then the learner's merge, is the same set.
    both = merged([{"obs": RunningStats.of(p)} for p in parts if len(p)])
    assert_same_stats(both["obs"], RunningStats.of(rows))


def test_statistics_survive_their_arrays_as_weights_carry_them():
    stats = SharedStatistics()
    stats.merge({"obs": RunningStats.of(np.arange(12.0).reshape(4, 3)), "ret": RunningStats.of(np.ones((5, 1)))})
    again = SharedStatistics()
    again.load({"actor.weight": np.zeros(2), **stats.arrays()})
    for name in ("obs", "ret"):
        assert_same_stats(again.parts[name], stats.parts[name])
    assert network_weights({"actor.weight": np.zeros(2), **stats.arrays()}).keys() == {"actor.weight"}


def test_observations_are_normalized_with_the_loaded_statistics_and_raw_rows_recorded():
    norm = Normalization(NormalizeConfig(obs=True, clip=3.0), training=True)
    seen = np.array([[1.0, 10.0], [3.0, 30.0], [5.0, 50.0]])
    stats = SharedStatistics()
    stats.merge({"obs": RunningStats.of(seen)})
    norm.load(stats.arrays())
    x = np.array([2.0, 1000.0], np.float32)
    out = norm.observation(x)
    expected = np.clip((x - seen.mean(0)) / np.sqrt(seen.var(0) + EPSILON), -3.0, 3.0)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert out.dtype == np.float32 and out[1] == 3.0  # clipped
    taken = norm.take()
    assert_same_stats(taken["obs"], RunningStats.of(x[None].astype(np.float64)))
    assert norm.take() is None  # handed out once


def test_an_evaluation_normalization_records_nothing():
    norm = Normalization(BOTH, training=False)
    norm.observation(np.ones(3))
    norm.reward(1.0, 1.0)
    assert norm.take() is None


def test_rewards_are_scaled_by_the_spread_of_the_discounted_return_reset_at_episode_ends():
    norm = normalization_for(BOTH, True)
    env = make_env("Pendulum-v1", {"max_episode_steps": 5}, normalization=norm)
    env.reset(seed=3)
    returns, raw, scaled, g = [], [], [], 0.0
    for _ in range(12):
        _, r, term, trunc, info = env.step(env.action_space.sample())
        g = g * BOTH.gamma + info[RAW_REWARD]
        returns.append(g)
        raw.append(info[RAW_REWARD])
        scaled.append(r)
        if term or trunc:
            env.reset()
            g = 0.0
    np.testing.assert_allclose(scaled, raw)  # nothing loaded yet: scale 1
    taken = norm.take()
    assert_same_stats(taken["ret"], RunningStats.of(np.array(returns)[:, None]))
    assert taken["obs"].count == 12 + 3  # steps and resets
    stats = SharedStatistics()
    stats.merge(taken)
    norm.load(stats.arrays())
    _, r, _, _, info = env.step(env.action_space.sample())
    assert r == pytest.approx(np.clip(info[RAW_REWARD] / np.sqrt(taken["ret"].var[0] + EPSILON), -10, 10))


def test_a_vector_env_counts_episode_returns_in_the_envs_own_rewards():
    scaled = VectorEnv("Pendulum-v1", 2, 0, {"max_episode_steps": 4}, normalize=BOTH)
    plain = VectorEnv("Pendulum-v1", 2, 0, {"max_episode_steps": 4})
    stats = SharedStatistics()
    stats.merge({"ret": RunningStats.of(np.array([[0.0], [100.0]]))})
    scaled.normalization.load(stats.arrays())
    actions = np.zeros((2, 1), np.float32)
    for _ in range(4):
        _, r_scaled, _, _, finished = scaled.step(actions)
        _, r_plain, _, _, finished_plain = plain.step(actions)
        np.testing.assert_allclose(r_scaled, np.clip(r_plain / 50.0, -10, 10), rtol=1e-5)
    assert finished == finished_plain and len(finished) == 2


def test_the_evaluation_env_normalizes_with_the_statistics_it_is_given_frozen():
    stats = SharedStatistics()
    stats.merge({"obs": RunningStats.of(np.random.default_rng(0).normal(0.5, 2.0, (50, 3)))})
    evaluation = VectorEnv("Pendulum-v1", 2, 7, normalize=BOTH, training=False, weights=stats.arrays())
    raw = VectorEnv("Pendulum-v1", 2, 7)
    o = stats.parts["obs"]
    for _ in range(3):
        np.testing.assert_allclose(evaluation.obs, (raw.obs - o.mean) / np.sqrt(o.var + EPSILON), rtol=1e-5, atol=1e-6)
        evaluation.step(np.ones((2, 1), np.float32))
        raw.step(np.ones((2, 1), np.float32))
    assert evaluation.normalization.take() is None


@pytest.mark.parametrize("training", [True, False])
def test_the_normalized_env_passes_gymnasiums_checker(training):
    import warnings

    env = make_env("Hopper-v5", normalization=normalization_for(BOTH, training), training=training)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its advice on wrapped envs is not a failure
        gymnasium_check_env(env, skip_render_check=True)


def test_a_dict_observation_s_float_leaves_are_normalized_each_by_their_own_statistics():
    """DictCartPole: `cart` and `pole` (floats of different scales) each get statistics of their own; the
    uint8 `clock` passes through untouched and is not recorded."""
    cfg = NormalizeConfig(obs=True, clip=4.0)
    norm = normalization_for(cfg, True)
    env = make_env("distrl.envs.testing:DictCartPole-v1", normalization=norm)
    space = env.observation_space
    assert space["cart"] == space["pole"] == spaces.Box(-4.0, 4.0, (2,), np.float32)
    assert space["clock"] == spaces.Box(0, 255, (1,), np.uint8)
    gymnasium_check_env(env.unwrapped, skip_render_check=True)
    raw = {"cart": [], "pole": []}
    obs, _ = env.reset(seed=1)
    for _ in range(40):
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        assert obs["clock"].dtype == np.uint8 and space.contains(obs)
        if term or trunc:
            obs, _ = env.reset()
    for leaf in raw:  # the rows recorded are the raw leaves: the unnormalized env's observations
        raw[leaf] = np.stack(norm.obs_rows[leaf])
    taken = norm.take()
    assert set(taken) == {"obs.cart", "obs.pole"}
    assert taken["obs.cart"].count == 42  # two resets' and 40 steps' observations

    stats = SharedStatistics()
    stats.merge(taken)
    frozen = normalization_for(cfg, False, stats.arrays())  # loaded before its env says which leaves it has
    evaluation = make_env("distrl.envs.testing:DictCartPole-v1", normalization=frozen, training=False)
    obs, _ = evaluation.reset(seed=5)
    again = make_env("distrl.envs.testing:DictCartPole-v1").reset(seed=5)[0]
    for leaf in ("cart", "pole"):
        want = np.clip((again[leaf] - raw[leaf].mean(0)) / np.sqrt(raw[leaf].var(0) + EPSILON), -4.0, 4.0)
        np.testing.assert_allclose(obs[leaf], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(obs["clock"], again["clock"])
    assert frozen.take() is None
