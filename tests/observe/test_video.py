"""Videos of the agent: `distrl eval --video` writes a playable mp4 (read back frame by frame) for CartPole
and the MAPF gridworld, `eval.video_every_s` films evaluations into RUN_DIR/videos/ and TensorBoard, and an
env without rgb_array rendering is one line."""
from __future__ import annotations

import glob
import os

import gymnasium as gym
import numpy as np
import pytest

from distrl.cli import main
from distrl.config import dump_yaml, load_config
from distrl.observe.video import Mp4Writer, read_mp4, write_mp4
from distrl.roles.evaluation import save_best
from distrl.roles.factory import make_algorithm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class NoRenderEnv(gym.Env):
    """An env that takes no render_mode: it cannot be filmed."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        super().__init__()

    def reset(self, *, seed=None, options=None):
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 1.0, True, False, {}


def run_dir_with_best(path, config: str, overrides: list[str]) -> str:
    """A run dir as `distrl eval` reads it: config.yaml and the (untrained) network as its best checkpoint."""
    cfg = load_config(os.path.join(ROOT, "configs", config), overrides)
    os.makedirs(path / "checkpoints")
    (path / "config.yaml").write_text(dump_yaml(cfg))
    weights = make_algorithm(cfg).make_learner("cpu").get_weights()
    save_best(str(path), weights, {"version": 3, "return_mean": 0.0, "metrics": {}})
    return str(path)


def test_frames_of_any_size_make_a_playable_h264_mp4(tmp_path):
    rng = np.random.default_rng(0)
    colours = rng.integers(0, 256, (12, 3))
    frames = [np.broadcast_to(c.astype(np.uint8), (33, 61, 3)).copy() for c in colours]  # odd sizes
    path = write_mp4(str(tmp_path / "a.mp4"), frames, fps=10)
    back, count, meta = read_mp4(path)
    assert count == 12 and meta["codec"] == "h264" and meta["fps"] == 10.0
    assert back[0].shape == (34, 62, 3)  # padded to even sizes, never resized
    for got, want in zip(back, frames):  # H.264 is lossy: flat colours come back within a few levels
        assert np.abs(got[:33, :61].astype(int) - want.astype(int)).mean() < 8
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)
    writer = Mp4Writer(str(tmp_path / "b.mp4"))
    for f in frames:
        writer.add(f)
    gif, h, w = writer.gif()
    assert gif[:6] == b"GIF89a" and (h, w) == (33, 61)


def test_eval_video_films_cartpole_episodes_into_one_mp4(tmp_path, capsys):
    run_dir = run_dir_with_best(tmp_path / "run", "ppo_cartpole.yaml", ["mode=single"])
    out = str(tmp_path / "cartpole.mp4")
    assert main(["eval", run_dir, "--video", out, "--episodes", "2"]) == 0
    printed = capsys.readouterr().out
    returns = float(printed.split("CartPole-v1: ")[1].split(" ±")[0]) * 2
    frames, count, meta = read_mp4(out, every=5)
    # One frame at each reset and one after each step; CartPole pays 1 per step.
    assert count == round(returns) + 2 and f"{count} frames" in printed
    assert frames[0].shape == (400, 600, 3) and meta["codec"] == "h264"
    assert all((f < 50).all(axis=2).any() for f in frames)  # the black cart is in every frame


def test_eval_video_films_the_mapf_gridworld_grid_agents_and_goals(tmp_path, capsys):
    kwargs = "env.kwargs={size: 8, num_agents: 3, density: 0.2, fov: 5, max_steps: 12, comm_k: 2}"
    run_dir = run_dir_with_best(tmp_path / "run", "dhc_mapf_8x8.yaml", [kwargs])
    out = str(tmp_path / "mapf.mp4")
    assert main(["eval", run_dir, "--video", out]) == 0
    frames, count, _ = read_mp4(out)
    assert 2 <= count <= 13 and f"{count} frames" in capsys.readouterr().out
    assert frames[0].shape == (8 * 24, 8 * 24, 3)
    from distrl.envs.mapf import MAPF

    env = MAPF(size=8, num_agents=3, density=0.2, fov=5, max_steps=12, comm_k=2)
    env.reset(seed=12345)  # the seed `distrl eval` plays its first episode with
    assert np.abs(frames[0].astype(int) - env.render().astype(int)).mean() < 4


def test_an_env_without_rgb_array_rendering_is_one_line(tmp_path, capsys):
    env = "env.id=tests.observe.test_video:NoRenderEnv"
    run_dir = run_dir_with_best(tmp_path / "run", "ppo_cartpole.yaml", [env])
    out = tmp_path / "none.mp4"
    assert main(["eval", run_dir, "--video", str(out)]) == 2
    err = capsys.readouterr().err
    assert "has no rgb_array rendering" in err and err.count("\n") == 1
    assert not out.exists() and not glob.glob(str(tmp_path / "*.mp4"))
    assert main(["train", os.path.join(ROOT, "configs", "ppo_cartpole.yaml"), "--set", env, "--set",
                 "eval.video_every_s=10", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "config key 'eval.video_every_s'" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_training_films_evaluations_into_the_run_dir_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from distrl.api import train

    run_dir = str(tmp_path / "run")
    summary = train(os.path.join(ROOT, "configs", "ppo_cartpole.yaml"), run_dir=run_dir, overrides=[
        "stop.max_env_steps=1024", "log.interval_steps=512", "eval.interval_steps=512", "eval.episodes=2",
        "eval.target_return=null", "log.progress=false", "eval.video_every_s=0"])
    assert summary["stop_reason"] == "max_env_steps"
    videos = sorted(glob.glob(os.path.join(run_dir, "videos", "eval_*.mp4")))
    assert len(videos) >= 2 and os.path.basename(videos[0]).startswith("eval_0000000512_")
    _, count, meta = read_mp4(videos[-1], every=1000)
    assert count >= 9 and meta["size"] == (600, 400)
    events = EventAccumulator(os.path.join(run_dir, "tb"), size_guidance={"images": 0})
    events.Reload()
    images = events.Images("eval/video")
    assert len(images) == len(videos) and images[0].encoded_image_string[:6] == b"GIF89a"


@pytest.mark.parametrize("fps", [None, 0, "x", 24])
def test_fps_comes_from_the_env_metadata(fps):
    from distrl.observe.video import fps_of

    env = type("E", (), {"metadata": {"render_fps": fps}})()
    assert fps_of(env) == (24.0 if fps == 24 else 30.0)
