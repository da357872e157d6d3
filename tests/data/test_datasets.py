"""Minari datasets: what distrl writes opens with minari.load_dataset, and what Minari's own API writes
reads back here step for step."""
import os

import gymnasium as gym
import minari
import numpy as np
import pytest
from minari.data_collector import EpisodeBuffer

from distrl.data.datasets import (DatasetError, DatasetWriter, Episode, check_new_name, dataset_info, read_dataset,
                                  space_mismatch)


def random_episodes(env_id: str, count: int, seed: int = 0) -> list[Episode]:
    env = gym.make(env_id)
    env.action_space.seed(seed)
    out = []
    for i in range(count):
        o, _ = env.reset(seed=seed + i)
        obs, acts, rews, term, trunc = [o], [], [], [], []
        while True:
            a = env.action_space.sample()
            o, r, te, tr, _ = env.step(a)
            obs.append(o), acts.append(a), rews.append(r), term.append(te), trunc.append(tr)
            if te or tr:
                break
        out.append(Episode(np.stack(obs), np.stack(acts), np.array(rews), np.array(term), np.array(trunc)))
    return out


def test_what_distrl_writes_opens_with_minari_and_reads_back_exactly(tmp_path, monkeypatch):
    env = gym.make("CartPole-v1")
    episodes = random_episodes("CartPole-v1", 4)
    writer = DatasetWriter(str(tmp_path / "cartpole-random-v0"), env.observation_space, env.action_space,
                           {"algo": "ppo", "seed": 7, "config": {"algo": "ppo", "seed": 7}})
    writer.add(episodes[:3])
    DatasetWriter(str(tmp_path / "cartpole-random-v0"), None, None, {}, append=True).add(episodes[3:])
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    loaded = minari.load_dataset("cartpole-random-v0")
    assert loaded.total_episodes == 4 and loaded.total_steps == sum(len(e.actions) for e in episodes)
    assert loaded.storage.metadata["distrl"]["seed"] == 7  # the run's seed and config travel with it
    for ep, back in zip(episodes, loaded.iterate_episodes()):
        np.testing.assert_array_equal(back.observations, ep.observations)
        np.testing.assert_array_equal(back.actions, ep.actions)
    steps = read_dataset(str(tmp_path / "cartpole-random-v0"))
    assert list(steps.episode_ends) == list(np.cumsum([len(e.actions) for e in episodes]))
    first = episodes[0]
    np.testing.assert_array_equal(steps.next_obs[: len(first.actions)], first.observations[1:])  # the true next obs
    assert steps.terminated[len(first.actions) - 1] == first.terminations[-1]


def test_a_dataset_written_with_minaris_own_api_reads_here(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    episodes = random_episodes("Pendulum-v1", 2)
    buffers = [EpisodeBuffer(observations=e.observations, actions=e.actions, rewards=e.rewards,
                             terminations=e.terminations, truncations=e.truncations) for e in episodes]
    minari.create_dataset_from_buffers("theirs/pendulum-v0", buffers, env="Pendulum-v1", algorithm_name="random",
                                       author="someone", author_email="-", code_permalink="-", description="-")
    steps = read_dataset("theirs/pendulum-v0")  # by id, under MINARI_DATASETS_PATH
    assert len(steps.rewards) == 400 and steps.truncated.sum() == 2 and not steps.terminated.any()
    np.testing.assert_allclose(steps.actions[:200], episodes[0].actions)
    obs_space, act_space, total = dataset_info("theirs/pendulum-v0")
    assert total == 400 and space_mismatch(act_space, gym.make("Pendulum-v1").action_space, "action") is None


def test_names_and_missing_datasets_are_one_line(tmp_path):
    with pytest.raises(DatasetError, match="must look like name-vN"):
        check_new_name(str(tmp_path / "no-version"))
    with pytest.raises(DatasetError, match="no Minari dataset at"):
        read_dataset(str(tmp_path / "missing-v0"))
    env = gym.make("CartPole-v1")
    DatasetWriter(str(tmp_path / "taken-v0"), env.observation_space, env.action_space, {}).add(random_episodes("CartPole-v1", 1))
    with pytest.raises(DatasetError, match="already exists"):
        check_new_name(str(tmp_path / "taken-v0"))


def test_space_mismatches_are_named():
    cart, pend = gym.make("CartPole-v1"), gym.make("Pendulum-v1")
    assert space_mismatch(cart.observation_space, cart.observation_space, "observation") is None
    assert "observation space" in space_mismatch(pend.observation_space, cart.observation_space, "observation")
    assert "action space" in space_mismatch(pend.action_space, cart.action_space, "action")


def test_a_dict_observation_dataset_reads_back_leaf_by_leaf_and_its_space_is_compared_whole(tmp_path, monkeypatch):
    from distrl import tree
    from distrl.envs import make_env

    env = make_env("distrl.envs.testing:DictCartPole-v1")
    env.action_space.seed(0)
    episodes = []
    for i in range(3):
        obs, _ = env.reset(seed=i)
        seen, acts, rews, term, trunc = [obs], [], [], [], []
        while not (term and (term[-1] or trunc[-1])):
            acts.append(env.action_space.sample())
            obs, r, te, tr, _ = env.step(acts[-1])
            seen.append(obs), rews.append(r), term.append(te), trunc.append(tr)
        episodes.append(Episode(tree.stack(seen), np.array(acts), np.array(rews), np.array(term), np.array(trunc)))
    DatasetWriter(str(tmp_path / "dict-random-v0"), env.observation_space, env.action_space, {}).add(episodes)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    back = next(minari.load_dataset("dict-random-v0").iterate_episodes())  # Minari's own reader sees the Dict
    np.testing.assert_array_equal(back.observations["pole"], episodes[0].observations["pole"])

    steps = read_dataset(str(tmp_path / "dict-random-v0"))
    n = len(episodes[0].actions)
    for leaf in ("cart", "clock", "pole"):
        assert steps.obs[leaf].dtype == episodes[0].observations[leaf].dtype
        np.testing.assert_array_equal(steps.obs[leaf][:n], episodes[0].observations[leaf][:-1])
        np.testing.assert_array_equal(steps.next_obs[leaf][:n], episodes[0].observations[leaf][1:])
    assert len(steps.obs["cart"]) == len(steps.rewards) == sum(len(e.actions) for e in episodes)
    assert space_mismatch(steps.observation_space, env.observation_space, "observation") is None
    other = make_env("distrl.envs.testing:DictCartPole-v1", obs_keys=["cart", "pole"]).observation_space
    assert "observation space Dict(" in space_mismatch(steps.observation_space, other, "observation")
