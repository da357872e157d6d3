"""Structured per-agent observations and action masks through the PettingZoo adapter: one tree of (N, ...)
arrays per step, the mask as its `action_mask` leaf (from the observation or from infos), the padding rule
leaf by leaf, and one clear line for what it does not take."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from distrl.envs.errors import EnvError
from distrl.envs.mapf import MAPF
from distrl.envs.multiagent import ParallelEnvAdapter, make_multiagent_env
from distrl.envs.multiagent_vector import MultiAgentVectorEnv
from distrl.envs.structured import MaskError
from distrl.envs.testing import MaskedAgents

MASKED = "distrl.envs.testing:MaskedAgents"


def test_a_dict_observation_with_its_mask_is_one_tree_of_agent_rows():
    env = make_multiagent_env(MASKED, {"num_agents": 3})
    assert env.observation_space == spaces.Dict({"observation": spaces.Box(-1, 1, (3,), np.float32),
                                                 "action_mask": spaces.MultiBinary(6)})
    st = env.reset(seed=4)
    raw = env.env.masks  # what the PettingZoo env gave each agent
    assert st.obs["observation"].shape == (3, 3) and st.obs["observation"].dtype == np.float32
    assert st.obs["action_mask"].dtype == np.int8
    np.testing.assert_array_equal(st.obs["action_mask"], np.stack([raw[a] for a in env.agent_ids]))
    assert (st.obs["action_mask"].sum(1) == 3).all()


def test_a_mask_in_infos_joins_a_box_observation_as_its_action_mask_leaf():
    env = make_multiagent_env(MASKED, {"mask_in": "info"})
    assert set(env.observation_space.spaces) == {"obs", "action_mask"}
    st = env.reset(seed=0)
    np.testing.assert_array_equal(st.obs["action_mask"], np.stack([env.env.masks[a] for a in env.agent_ids]))
    legal = st.obs["action_mask"].argmax(1)
    st = env.step(legal)
    assert st.rewards.tolist() == [1.0, 1.0] and not st.terminated
    np.testing.assert_array_equal(st.obs["action_mask"], np.stack([env.env.masks[a] for a in env.agent_ids]))
    # The same env without the mask is one flat Box again; an illegal action ends everyone's episode at -100.
    bare = make_multiagent_env(MASKED, {"mask_in": "info"}, action_mask="none")
    assert bare.observation_space == spaces.Box(-1, 1, (3,), np.float32)
    bare.reset(seed=0)
    st = bare.step(np.array([bare.env.masks[a].argmin() for a in bare.agent_ids]))  # illegal ones
    assert st.terminated and st.rewards.tolist() == [-100.0, -100.0] and not st.active.any()


class Leaving(MaskedAgents):
    """Agent 1 leaves after the first step, the others go on."""

    def step(self, actions):
        obs, rewards, term, trunc, infos = super().step(actions)
        if self.agents:
            term["agent_1"] = True
            self.agents = [a for a in self.agents if a != "agent_1"]
        return obs, rewards, term, trunc, infos


def test_an_agent_out_of_its_episode_has_a_zero_observation_and_every_action_legal():
    env = ParallelEnvAdapter(Leaving(num_agents=3))
    st = env.reset(seed=1)
    st = env.step(st.obs["action_mask"].argmax(1))
    assert st.active.tolist() == [True, False, True]
    assert not st.obs["observation"][1].any() and st.obs["action_mask"][1].tolist() == [1] * 6
    assert st.obs["action_mask"][[0, 2]].sum(1).tolist() == [3, 3]


class Mixed:
    """Agents whose Dict observations hold a vector of differing sizes, a Discrete and an image leaf."""

    def __init__(self, b_space=None):
        self.possible_agents, self.agents = ["a", "b"], []
        self._obs = {
            "a": spaces.Dict({"v": spaces.Box(-1, 1, (2,), np.float32), "d": spaces.Discrete(4),
                              "img": spaces.Box(0, 255, (1, 3, 3), np.uint8)}),
            "b": b_space or spaces.Dict({"v": spaces.Box(-2, 3, (3,), np.float32), "d": spaces.Discrete(4),
                                         "img": spaces.Box(0, 255, (1, 3, 3), np.uint8)})}

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return ({"a": {"v": np.ones(2), "d": 3, "img": np.full((1, 3, 3), 7, np.uint8)},
                 "b": {"v": np.full(3, 2.0), "d": 1, "img": np.zeros((1, 3, 3), np.uint8)}}, {})

    def step(self, actions):
        self.agents = []
        return self.reset()[0], {"a": 0.0, "b": 0.0}, {"a": True, "b": True}, {"a": False, "b": False}, {}

    def close(self):
        pass


def test_the_padding_rule_applies_leaf_by_leaf_and_leaves_keep_their_dtypes():
    env = ParallelEnvAdapter(Mixed())
    space = env.observation_space
    assert space["v"] == spaces.Box(-2, 3, (3,), np.float32)  # padded to the larger, bounds the widest
    assert space["d"] == spaces.Discrete(4) and space["img"].dtype == np.uint8 and space["img"].shape == (1, 3, 3)
    st = env.reset()
    assert st.obs["v"].tolist() == [[1, 1, 0], [2, 2, 2]] and st.obs["d"].tolist() == [3, 1]
    assert st.obs["img"].dtype == np.uint8 and st.obs["img"][0].max() == 7
    vec = MultiAgentVectorEnv("tests.envs.test_multiagent_structured:Mixed", 2, 0)
    assert vec.obs["obs"]["img"].shape == (2, 2, 1, 3, 3) and vec.obs["obs"]["d"].dtype == np.int64
    nxt, *_ = vec.step(np.zeros((2, 2), np.int64))
    assert nxt["obs"]["v"].shape == (2, 2, 3) and vec.obs["obs"]["v"][:, 1].tolist() == [[2, 2, 2]] * 2


@pytest.mark.parametrize("b_space, words", [
    (spaces.Dict({"v": spaces.Box(-1, 1, (2,), np.float32), "d": spaces.Discrete(4)}), "differ in their keys"),
    (spaces.Dict({"v": spaces.Box(-1, 1, (2,), np.float32), "d": spaces.Discrete(5),
                  "img": spaces.Box(0, 255, (1, 3, 3), np.uint8)}), "'d' differs between agents"),
    (spaces.Dict({"v": spaces.Box(-1, 1, (2,), np.float32), "d": spaces.Text(4),
                  "img": spaces.Box(0, 255, (1, 3, 3), np.uint8)}), "config key 'env.obs_keys'"),
])
def test_what_the_adapter_does_not_take_is_one_line_naming_it(b_space, words):
    with pytest.raises(EnvError, match=words) as e:
        ParallelEnvAdapter(Mixed(b_space))
    assert "\n" not in str(e.value)


def test_obs_keys_select_each_agents_keys():
    env = ParallelEnvAdapter(Mixed(), obs_keys=["v", "d"])
    assert set(env.observation_space.spaces) == {"v", "d"}
    assert set(env.reset().obs) == {"v", "d"}
    with pytest.raises(EnvError, match="config key 'env.obs_keys': an agent's observation has no key 'x'"):
        ParallelEnvAdapter(Mixed(), obs_keys=["x"])
    with pytest.raises(EnvError, match="config key 'env.obs_keys'.*MultiAgentEnv"):
        make_multiagent_env("distrl.envs.mapf:MAPF", {"size": 6, "num_agents": 2}, obs_keys=["x"])
    assert isinstance(make_multiagent_env("distrl.envs.mapf:MAPF", {"size": 6, "num_agents": 2}), MAPF)


class BadMask(MaskedAgents):
    def __init__(self, bad: str, **kwargs):
        super().__init__(**kwargs)
        self.bad = bad

    def _observe(self):
        obs, infos = super()._observe()
        a = self.agents[-1] if self.agents else None
        if a is not None and self.bad == "none_legal":
            (infos[a] if self.mask_in == "info" else obs[a])["action_mask"][:] = 0
        if a is not None and self.bad == "missing":
            infos[a] = {}
        return obs, infos


@pytest.mark.parametrize("bad, mask_in, words", [
    ("none_legal", "obs", "agent_1 at step 0 of its episode: the action mask allows no action"),
    ("none_legal", "info", "the action mask allows no action"),
    ("missing", "info", "agent_1's info has no 'action_mask' \\(step 0"),
])
def test_a_mask_no_action_can_follow_is_refused_naming_the_agent_and_step(bad, mask_in, words):
    env = ParallelEnvAdapter(BadMask(bad, mask_in=mask_in), action_mask=mask_in)
    with pytest.raises(MaskError, match=words):
        env.reset(seed=0)


def test_mask_sources_resolve_as_for_one_agent():
    assert ParallelEnvAdapter(MaskedAgents(mask_in="info"))._observations.source == "info"  # auto: a reset's infos
    assert ParallelEnvAdapter(MaskedAgents())._observations.source == "obs"
    dropped = ParallelEnvAdapter(MaskedAgents(), action_mask="none")
    assert set(dropped.observation_space.spaces) == set(dropped.reset(seed=0).obs) == {"observation"}
    with pytest.raises(EnvError, match="config key 'env.action_mask': obs takes the observation's 'action_mask'"):
        ParallelEnvAdapter(MaskedAgents(mask_in="info"), action_mask="obs")
    box = MaskedAgents()
    box.action_space = lambda agent: spaces.Box(-1, 1, (2,), np.float32)
    with pytest.raises(EnvError, match="masks are for Discrete actions"):
        ParallelEnvAdapter(box)
    assert ParallelEnvAdapter(box, action_mask="none").observation_space == spaces.Dict(
        {"observation": spaces.Box(-1, 1, (3,), np.float32)})
