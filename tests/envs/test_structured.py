"""env.obs_keys and env.action_mask: structured observations made ready for a network, masks as a leaf."""
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from distrl.envs import EnvError, make_env
from distrl.envs.structured import MaskError, mask_size
from distrl.envs.vector import VectorEnv

DOORKEY = "minigrid:MiniGrid-DoorKey-5x5-v0"


class MaskedChoice(gym.Env):
    """Discrete(4) actions of which the observation's mask allows some; `bad` breaks one promise."""

    def __init__(self, bad: str = ""):
        self.bad = bad
        self.observation_space = spaces.Dict({"x": spaces.Box(0, 1, (2,), np.float32),
                                              "action_mask": spaces.MultiBinary(4)})
        self.action_space = spaces.Discrete(4)
        self.t = 0

    def _obs(self):
        mask = np.array([1, 0, 1, 0], np.int8)
        if self.bad == "shape":
            mask = np.ones(3, np.int8)
        if self.bad == "none_legal" and self.t == 2:
            mask[:] = 0
        obs = {"x": np.full(2, self.t / 10, np.float32), "action_mask": mask}
        if self.bad == "keys" and self.t > 0:
            del obs["x"]
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 5, {}


def test_obs_keys_keep_the_named_leaves_and_the_rest_is_refused_in_one_line():
    env = make_env(DOORKEY, obs_keys=["image", "direction"], action_mask="auto")
    assert set(env.observation_space.spaces) == {"image", "direction"}
    obs, _ = env.reset(seed=0)
    assert obs["direction"].dtype == np.int64 and obs["direction"].shape == () and obs["image"].dtype == np.uint8
    check_env(env.unwrapped)  # gymnasium's own checks hold for the env distrl wraps
    with pytest.raises(EnvError, match=r"leaf 'mission' is a MissionSpace, which gives no arrays a network takes "
                                       r"\(keep the others: env.obs_keys: \[direction, image\]\)"):
        make_env(DOORKEY)
    with pytest.raises(EnvError, match=r"env.obs_keys': .* has no key 'imgae' \(its keys: direction, image, mission\)"):
        make_env(DOORKEY, obs_keys=["imgae"])
    with pytest.raises(EnvError, match="selects keys of a Dict observation"):
        make_env("CartPole-v1", obs_keys=["x"])


def test_taxi_s_info_mask_becomes_the_action_mask_leaf():
    envs = VectorEnv("Taxi-v4", 3, 0, action_mask="auto")
    assert set(envs.observation_space.spaces) == {"obs", "action_mask"}
    assert envs.obs["action_mask"].shape == (3, 6) and envs.obs["action_mask"].dtype == np.int8
    for _ in range(50):
        nxt, *_ = envs.step(np.array([envs.obs["action_mask"][i].nonzero()[0][0] for i in range(3)]))
        assert nxt["action_mask"].any(axis=1).all()
        assert np.array_equal(nxt["obs"].sum(axis=1), np.ones(3))  # the one-hot state beside its mask
    assert VectorEnv("Taxi-v4", 1, 0, action_mask="none").observation_space == spaces.Box(0, 1, (500,), np.float32)


def test_masks_that_cannot_be_acted_on_are_named():
    assert mask_size(spaces.MultiDiscrete([3, 2])) == 5 and mask_size(spaces.MultiBinary(2)) == 4
    env = make_env("tests.envs.test_structured:MaskedChoice", action_mask="obs")
    obs, _ = env.reset(seed=0)
    assert obs["action_mask"].tolist() == [1, 0, 1, 0]
    with pytest.raises(MaskError, match=r"gives a mask shaped \(3,\) \(int8\); its actions Discrete\(4\) take 4"):
        make_env("tests.envs.test_structured:MaskedChoice", {"bad": "shape"}, action_mask="obs").reset(seed=0)
    bad = make_env("tests.envs.test_structured:MaskedChoice", {"bad": "none_legal"}, action_mask="obs")
    bad.reset(seed=0)
    bad.step(0)
    with pytest.raises(MaskError, match="MaskedChoice at step 2 of its episode: the action mask allows no action"):
        bad.step(0)
    with pytest.raises(EnvError, match="'env.action_mask': obs takes the observation's 'action_mask' key"):
        make_env("CartPole-v1", action_mask="obs")
    with pytest.raises(EnvError, match="masks are for Discrete, MultiDiscrete and MultiBinary actions"):
        make_env("Pendulum-v1", action_mask="info")
    with pytest.raises(MaskError, match="info has no 'action_mask'"):
        make_env("CartPole-v1", action_mask="info").reset(seed=0)


def test_an_env_whose_keys_change_between_reset_and_step_is_refused():
    env = make_env("tests.envs.test_structured:MaskedChoice", {"bad": "keys"}, action_mask="none")
    env.reset(seed=0)
    with pytest.raises(EnvError, match=r"gave an observation with keys \['action_mask'\], where the space has "
                                       r"\['action_mask', 'x'\]"):
        env.step(0)


def test_a_vector_of_structured_envs_keeps_true_final_observations():
    envs = VectorEnv("tests.envs.test_structured:MaskedChoice", 2, 0, action_mask="obs")
    for t in range(5):
        nxt, _, _, trunc, _ = envs.step(np.zeros(2, np.int64))
    assert trunc.all() and np.allclose(nxt["x"], 0.5) and np.allclose(envs.obs["x"], 0.0)
