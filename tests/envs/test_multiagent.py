"""The multi-agent protocol: PettingZoo adapter (mpe2 simple_spread, the MAPF view), env ids."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces
from mpe2 import simple_spread_v3

from distrl.envs.factory import EnvError
from distrl.envs.mapf import MAPF, parallel_env
from distrl.envs.multiagent import (
    ParallelEnvAdapter,
    ParallelView,
    make_multiagent_env,
)

SPREAD = {"N": 3, "continuous_actions": False, "max_cycles": 25}


# --- simple_spread through the adapter ------------------------------------------------------
def test_simple_spread_shapes_rewards_and_truncation():
    env = make_multiagent_env("mpe2:simple_spread_v3", SPREAD)
    raw = simple_spread_v3.parallel_env(**SPREAD)
    assert env.num_agents == 3 and env.observation_space.shape == (18,) and env.action_space.n == 5
    st = env.reset(seed=3)
    raw_obs, _ = raw.reset(seed=3)
    assert st.obs.shape == (3, 18) and st.obs.dtype == np.float32 and st.active.all()
    assert np.allclose(st.obs, [raw_obs[a] for a in raw.possible_agents])
    assert np.array_equal(st.comm_mask, ~np.eye(3, dtype=bool))  # default: all pairs of active agents
    rng, total = np.random.default_rng(0), np.zeros(3)
    for t in range(1, 26):
        actions = rng.integers(0, 5, 3)
        st = env.step(actions)
        raw_obs, raw_rew, _, _, _ = raw.step({a: int(x) for a, x in zip(raw.possible_agents, actions)})
        assert np.allclose(st.rewards, [raw_rew[a] for a in raw.possible_agents], atol=1e-6)
        assert np.allclose(st.obs, [raw_obs[a] for a in raw.possible_agents])
        total += st.rewards
        assert st.truncated == (t == 25) and not st.terminated
        assert st.active.all()  # cut by the step limit: final observations kept for bootstrapping
        assert (st.info != {}) == (t == 25)
    assert st.info["return_mean"] == pytest.approx(total.mean(), rel=1e-5)
    with pytest.raises(RuntimeError):
        env.step(np.zeros(3, int))
    env.close()


def test_the_adapters_state_is_the_pettingzoo_envs_global_state():
    env = make_multiagent_env("mpe2:simple_spread_v3", SPREAD)
    raw = simple_spread_v3.parallel_env(**SPREAD)
    assert env.state_space.shape == (54,) and env.state_space.dtype == np.float32
    st = env.reset(seed=3)
    raw.reset(seed=3)
    assert st.state.dtype == np.float32
    np.testing.assert_array_equal(st.state, raw.state())
    rng = np.random.default_rng(0)
    for _ in range(3):
        actions = rng.integers(0, 5, 3)
        st = env.step(actions)
        raw.step({a: int(x) for a, x in zip(raw.possible_agents, actions)})
        np.testing.assert_array_equal(st.state, raw.state())
    mapf = MAPF(size=6, num_agents=3)  # no global state
    assert mapf.state_space is None and mapf.reset(seed=0).state is None


@pytest.mark.parametrize("through", ["adapter", "env.kwargs"])
def test_simple_spread_k_nearest_comm_mask(through):
    if through == "adapter":
        env = ParallelEnvAdapter(simple_spread_v3.parallel_env(**SPREAD), comm_k=1)
    else:  # as a config sets it: simple_spread's constructor refuses comm_k, so the adapter takes it
        env = make_multiagent_env("mpe2:simple_spread_v3", {**SPREAD, "comm_k": 1})
    st = env.reset(seed=1)
    for _ in range(5):
        pos = np.stack([a.state.p_pos for a in env.env.unwrapped.world.agents])
        d = np.linalg.norm(pos[:, None] - pos[None], axis=-1) + np.diag([np.inf] * 3)
        assert [np.flatnonzero(r).tolist() for r in st.comm_mask] == [[int(np.argmin(r))] for r in d]
        st = env.step(np.array([1, 2, 3]))


def test_simple_spread_comm_radius_from_env_kwargs():
    env = make_multiagent_env("mpe2:simple_spread_v3", {**SPREAD, "comm_radius": 0.8})
    seen = set()
    for seed in range(4):
        st = env.reset(seed=seed)
        for _ in range(10):
            pos = np.stack([a.state.p_pos for a in env.env.unwrapped.world.agents])
            near = (np.abs(pos[:, None] - pos[None]).max(axis=-1) <= 0.8) & ~np.eye(3, dtype=bool)
            np.testing.assert_array_equal(st.comm_mask, near)
            seen.update(st.comm_mask[~np.eye(3, dtype=bool)].tolist())
            st = env.step(np.array([1, 2, 3]))
    assert seen == {True, False}  # the radius both keeps and cuts pairs: not the all-pairs default


# --- the MAPF gridworld's ParallelEnv ---------------------------------------------------------
@pytest.mark.parametrize("remove", [True, False])
def test_mapf_parallel_api(remove):
    with warnings.catch_warnings():  # pettingzoo.test imports its old-API classic envs, which warn
        warnings.simplefilter("ignore", DeprecationWarning)
        from pettingzoo.test import parallel_api_test
    parallel_api_test(parallel_env(size=7, num_agents=4, density=0.2, fov=5, max_steps=60,
                                   remove_done_agents=remove), num_cycles=300)


MAP = {"obstacles": np.array([[0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]], bool),
       "starts": np.array([[0, 1], [0, 3]]), "goals": np.array([[0, 2], [0, 0]])}


class FixedMap(ParallelView):
    def reset(self, seed=None, options=None):
        return super().reset(seed, options=MAP)


def test_adapter_masks_agents_that_finish_early():
    env = ParallelEnvAdapter(FixedMap(MAPF(size=4, num_agents=2, remove_done_agents=True)))
    st = env.reset(seed=0)
    assert st.active.all() and st.comm_mask.tolist() == [[False, True], [True, False]]
    st = env.step(np.array([4, 0]))  # agent 0 steps right onto its goal and leaves
    assert st.active.tolist() == [False, True] and not st.terminated
    assert not st.obs[0].any() and st.obs[1].any()
    assert st.rewards[0] == pytest.approx(-0.075 + 3.0) and not st.comm_mask.any()
    for t in range(3):  # agent 1 walks left through the cell agent 0 left
        st = env.step(np.array([3, 3]))
        assert st.rewards[0] == 0.0 and not st.obs[0].any()
        assert st.terminated == (t == 2) and not st.truncated
    assert st.info["success"] == 1.0 and st.info["makespan"] == 4.0 and st.info["sum_of_costs"] == 5.0
    assert st.info["return_mean"] == pytest.approx(((3 - 0.075) + (-0.075 - 0.075 * 2 + 3 - 0.075)) / 2)


def test_adapter_invariants_on_mapf_episodes():
    rng, ends = np.random.default_rng(0), set()
    for ep, max_steps in enumerate([8, 200, 8, 200]):
        env = make_multiagent_env("distrl.envs.mapf:parallel_env", dict(
            size=8, num_agents=6, density=0.1, fov=5, max_steps=max_steps, remove_done_agents=True))
        st, total = env.reset(seed=ep), np.zeros(6)
        while True:
            before = st.active
            # mostly follow the heuristic channels (toward the goal) so that some episodes finish
            greedy = 1 + np.argmax(st.obs[:, 3:7, 2, 2] + 0.1 * rng.random((6, 4)), axis=1)
            st = env.step(np.where(rng.random(6) < 0.8, greedy, rng.integers(0, 5, 6)))
            total += st.rewards
            assert not st.obs[~st.active].any() and not st.rewards[~before].any()
            assert not st.comm_mask[~st.active].any() and not st.comm_mask[:, ~st.active].any()
            assert not (st.active & ~before).any()  # nobody comes back
            if st.terminated or st.truncated:
                break
        ends.add("terminated" if st.terminated else "truncated")
        assert st.terminated != st.truncated
        assert {"success", "makespan", "sum_of_costs", "collisions"} <= set(st.info)
        assert st.info["return_mean"] == pytest.approx(total.mean(), rel=1e-5)
        assert st.info["success"] == float(st.terminated)
    assert ends == {"terminated", "truncated"}


def test_parallel_view_matches_native_env():
    kw = dict(size=10, num_agents=4, max_steps=20)
    native, adapted = MAPF(**kw), make_multiagent_env("distrl.envs.mapf:parallel_env", kw)
    a, b = native.reset(seed=5), adapted.reset(seed=5)
    rng = np.random.default_rng(1)
    while not (a.truncated or a.terminated):
        assert np.array_equal(a.obs, b.obs) and np.array_equal(a.comm_mask, b.comm_mask)
        actions = rng.integers(0, 5, 4)
        a, b = native.step(actions), adapted.step(actions)
        assert np.array_equal(a.rewards, b.rewards)
    assert (a.truncated, a.terminated) == (b.truncated, b.terminated)
    assert a.info == pytest.approx(b.info)


# --- adapter space handling -------------------------------------------------------------------
class TwoShapes:
    """A minimal ParallelEnv whose agents see differently shaped observations."""

    def __init__(self, act_space=None):
        self.possible_agents = ["a", "b"]
        self._obs = {"a": spaces.Box(-1, 1, (3,), np.float32), "b": spaces.Box(0, 5, (2, 2), np.float32)}
        self._act = act_space or spaces.Discrete(3, start=1)
        self.agents, self.got = [], None

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._act

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {"a": np.full(3, -1.0), "b": np.full((2, 2), 2.0)}, {}

    def step(self, actions):
        self.got, self.agents = actions, []
        return ({"a": np.zeros(3), "b": np.ones((2, 2))}, {"a": 1.0, "b": 2.0},
                {"a": True, "b": True}, {"a": False, "b": False}, {})

    def close(self):
        pass


def test_differing_shapes_are_flattened_and_padded():
    env = ParallelEnvAdapter(TwoShapes())
    assert env.observation_space.shape == (4,)
    assert env.observation_space.low.tolist() == [-1, -1, -1, 0] and env.observation_space.high.tolist() == [5] * 4
    st = env.reset()
    assert st.obs.tolist() == [[-1, -1, -1, 0], [2, 2, 2, 2]]
    st = env.step(np.array([0, 2]))
    assert env.env.got == {"a": 1, "b": 3}  # 0-based actions, shifted by the space's start
    assert st.terminated and not st.active.any() and not st.obs.any()
    assert st.rewards.tolist() == [1.0, 2.0] and st.info["return_mean"] == 1.5


class Leaky(TwoShapes):
    """Keeps reporting rewards and observations for an agent that has left."""

    def step(self, actions):
        self.got = actions
        gone = self.agents == ["b"]
        self.agents = ["b"] if not gone else []
        return ({"a": np.ones(3), "b": np.ones((2, 2))}, {"a": 1.0, "b": 2.0},
                {"a": True, "b": gone}, {"a": False, "b": False}, {})


def test_agents_that_left_get_nothing_even_if_the_env_reports_them():
    env = ParallelEnvAdapter(Leaky())
    env.reset()
    st = env.step(np.array([0, 0]))
    assert st.active.tolist() == [False, True] and st.rewards.tolist() == [1.0, 2.0] and not st.obs[0].any()
    st = env.step(np.array([0, 0]))
    assert env.env.got == {"b": 1}  # only live agents are asked to act
    assert st.terminated and st.rewards.tolist() == [0.0, 2.0] and st.info["return_mean"] == 2.5


def test_one_box_for_every_agent_is_continuous_actions_and_mixed_actions_are_rejected():
    box = spaces.Box(0, 1, (2,), np.float32)
    adapter = ParallelEnvAdapter(TwoShapes(act_space=box))
    assert adapter.action_space == box
    adapter.reset(seed=0)
    adapter.step(np.array([[0.1, 0.2], [0.3, 0.4]], np.float32))
    np.testing.assert_array_equal(adapter.env.got["b"], np.array([0.3, 0.4], np.float32))  # each agent's row, as given
    mixed = TwoShapes()
    mixed.action_space = lambda agent: box if agent == "a" else spaces.Discrete(3)
    with pytest.raises(EnvError, match="Discrete of one size, or one Box"):
        ParallelEnvAdapter(mixed)
    other = TwoShapes()
    other.action_space = lambda agent: box if agent == "a" else spaces.Box(-1, 1, (2,), np.float32)
    with pytest.raises(EnvError, match="one and the same for every agent"):
        ParallelEnvAdapter(other)
    with pytest.raises(EnvError, match="positions"):
        ParallelEnvAdapter(TwoShapes(), comm_k=2)


# --- env ids ----------------------------------------------------------------------------------
def test_make_multiagent_env_resolves_ids():
    assert isinstance(make_multiagent_env("distrl.envs.mapf:MAPF", {"size": 8, "num_agents": 2}), MAPF)
    env = make_multiagent_env("mpe2:simple_spread_v3", SPREAD)
    assert isinstance(env, ParallelEnvAdapter) and env.num_agents == 3


@pytest.mark.parametrize("env_id, kwargs, key", [
    ("simple_spread_v3", None, "env.id"),
    ("no_such_module_xyz:Env", None, "env.id"),
    ("distrl.envs.mapf:Nope", None, "env.id"),
    ("mpe2:no_such_env_v0", None, "env.id"),
    ("builtins:dict", None, "env.id"),
    ("distrl.envs.mapf:MAPF", {"bogus": 1}, "env.kwargs"),
    ("distrl.envs.mapf:MAPF", {"density": 1.5}, "env.kwargs"),
    ("mpe2:simple_spread_v3", {"N": 3, "bogus": 1}, "env.kwargs"),
    ("mpe2:simple_spread_v3", {"N": 3, "comm_k": -1}, "env.kwargs"),
    ("mpe2:simple_spread_v3", {"N": 3, "comm_radius": 0}, "env.kwargs"),
    ("distrl.envs.mapf:MAPF", {"comm_radius": 2.0}, "env.kwargs"),  # MAPF's view sets its radius
    ("distrl.envs.mapf:parallel_env", {"comm_radius": 2.0}, "env.kwargs"),  # its own mask: nothing to limit
])
def test_make_multiagent_env_errors_name_the_key(env_id, kwargs, key):
    with pytest.raises(EnvError, match=f"config key '{key}'"):
        make_multiagent_env(env_id, kwargs)
