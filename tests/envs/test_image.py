"""`ResizeImage` shrinks a frame that is the observation or one Dict leaf, by area averaging, gray if asked,
and refuses what is no frame in one line naming it."""
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from distrl.envs import EnvError, check_env, make_env
from distrl.envs.image import ResizeImage

WRAPPER = "distrl.envs.image:ResizeImage"


class Frames(gym.Env):
    """A 240x320 RGB frame (left half red, right half blue) and a count, in a Dict or as the observation."""

    def __init__(self, as_dict: bool = True):
        frame = spaces.Box(0, 255, (240, 320, 3), np.uint8)
        self.as_dict = as_dict
        self.observation_space = spaces.Dict({"screen": frame, "ammo": spaces.Box(0, 50, (1,), np.float32)}) \
            if as_dict else frame
        self.action_space = spaces.Discrete(2)

    def obs(self):
        frame = np.zeros((240, 320, 3), np.uint8)
        frame[:, :160, 0], frame[:, 160:, 2] = 200, 100
        return {"screen": frame, "ammo": np.array([7.0], np.float32)} if self.as_dict else frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.obs(), {}

    def step(self, action):
        return self.obs(), 0.0, False, False, {}


def test_a_dict_leaf_is_shrunk_by_area_and_made_gray_and_the_other_leaves_pass_through():
    env = ResizeImage(Frames(), shape=(60, 80), grayscale=True, key="screen")
    assert env.observation_space["screen"] == spaces.Box(0, 255, (60, 80, 1), np.uint8)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and obs["ammo"][0] == 7.0
    red, blue = round(0.299 * 200), round(0.114 * 100)  # ITU-R 601 luma of each half
    assert (np.abs(obs["screen"][:, :40, 0].astype(int) - red) <= 1).all()
    assert (np.abs(obs["screen"][:, 40:, 0].astype(int) - blue) <= 1).all()


def test_a_frame_observation_keeps_its_channels_when_not_gray():
    env = ResizeImage(Frames(as_dict=False), shape=[30, 40])
    obs, _ = env.reset(seed=0)
    assert obs.shape == (30, 40, 3) and env.observation_space.contains(obs)
    assert (obs[:, :20, 0] == 200).all() and (obs[:, 20:, 2] == 100).all()


@pytest.mark.parametrize("kwargs, says", [
    ({"shape": [60, 80], "key": "frame"}, "key 'frame' is no leaf of the observation (its keys: ammo, screen)"),
    ({"shape": [60, 80], "key": "ammo"}, "the frame must be a uint8 Box shaped (height, width, channels)"),
    ({"shape": [60]}, "shape must be [height, width] in positive pixels, got [60]"),
])
def test_what_is_no_frame_is_one_line_naming_it(kwargs, says):
    with pytest.raises(ValueError) as e:
        ResizeImage(Frames(), **kwargs)
    assert says in str(e.value)


def test_vizdooms_screen_leaf_is_downscaled_and_its_game_variables_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a DoomGame writes _vizdoom.ini and _vizdoom/ where it runs
    env = make_env("vizdoom.gymnasium_wrapper:VizdoomBasic-v1", {"frame_skip": 4, "screen_resolution": "RES_160X120"},
                   wrappers=[{WRAPPER: {"shape": [60, 80], "grayscale": True, "key": "screen"}}])
    obs, _ = env.reset(seed=0)
    assert obs["screen"].shape == (60, 80, 1) and obs["screen"].std() > 0 and obs["gamevariables"].shape == (1,)
    env.close()


def test_a_wrong_key_in_the_config_is_one_line_naming_the_wrapper(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EnvError) as e:
        check_env("vizdoom.gymnasium_wrapper:VizdoomBasic-v1", wrappers=[{WRAPPER: {"shape": [60, 80], "key": "image"}}])
    assert str(e.value).startswith("config key 'env.wrappers[0]': ResizeImage(")
    assert "key 'image' is no leaf of the observation (its keys: gamevariables, screen)" in str(e.value)


def games_in(directory: str) -> list[int]:
    """The pids of VizDoom game processes running in `directory` (Linux's /proc)."""
    import os

    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as fh:
                if fh.read().strip() == "vizdoom" and os.readlink(f"/proc/{pid}/cwd") == directory:
                    out.append(int(pid))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return out


def test_a_vizdoom_run_leaves_no_game_process_behind(tmp_path, monkeypatch):
    """A DoomGame runs in a process of its own, which outlives the one that made it unless the env is
    closed: a single-mode PPO run on VizDoom Basic closes its workers' and evaluator's envs at its end."""
    import os
    import time

    from distrl import train

    monkeypatch.chdir(tmp_path)
    cfg = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs",
                       "ppo_vizdoom_basic.yaml")
    summary = train(cfg, run_dir=str(tmp_path / "run"), overrides=[
        "env.num_envs=2", "rollout.fragment_length=32", "stop.max_env_steps=256", "eval.episodes=2",
        "eval.interval_s=1", "log.progress=false", "log.tensorboard=false"])
    assert summary["env_steps"] >= 256 and summary["evaluations"] >= 1
    deadline = time.time() + 5  # a closed game takes a moment to exit
    while games_in(str(tmp_path)) and time.time() < deadline:
        time.sleep(0.1)
    assert games_in(str(tmp_path)) == []
