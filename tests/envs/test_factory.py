"""Env ids: Atari and MinAtar ids work with no import by the user; an unknown game is one line with a hint."""
import subprocess
import sys

import numpy as np
import pytest

from distrl.envs import EnvError, VectorEnv, check_env, env_spec


def test_atari_and_minatar_ids_resolve_in_a_fresh_process_without_imports():
    code = ("import sys\n"
            "from distrl.envs import env_spec\n"
            "assert 'ale_py' not in sys.modules and 'minatar' not in sys.modules\n"
            "print(env_spec('ALE/Breakout-v5').observation_space.shape, env_spec('MinAtar/Breakout-v1').observation_space.shape)\n"
            "assert 'minatar' in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "(210, 160, 3) (10, 10, 4)"


def test_an_env_that_is_neither_atari_nor_minatar_does_not_import_them():
    code = ("import sys\nfrom distrl.envs import check_env\ncheck_env('CartPole-v1')\n"
            "print('minatar' in sys.modules, 'ale_py' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stderr


@pytest.mark.parametrize("env_id, hint", [
    ("ALE/NoSuchGame-v5", "ALE/"),
    ("ALE/Breakot-v5", "ALE/Breakout-v5"),
    ("MinAtar/Nope-v1", "MinAtar/"),
    ("MinAtar/Breakout-v3", "MinAtar/Breakout-v0, MinAtar/Breakout-v1"),
])
def test_an_unknown_game_is_one_line_naming_it_with_close_ids(env_id, hint):
    with pytest.raises(EnvError) as e:
        check_env(env_id)
    message = str(e.value)
    assert message.startswith(f"config key 'env.id': unknown gymnasium environment {env_id!r} (did you mean ")
    assert hint in message and "\n" not in message


def test_minatar_observations_are_10x10_channels_last_bools_and_not_frame_stacks():
    spec = check_env("MinAtar/Breakout-v1")
    assert spec.observation_space.shape == (10, 10, 4) and spec.observation_space.dtype == np.bool_
    assert spec.action_space.n == 3 and spec.frame_stack == 0
    envs = VectorEnv("MinAtar/Breakout-v1", 3, seed=0)
    next_obs, rewards, term, trunc, _ = envs.step(np.zeros(3, np.int64))
    assert envs.obs.dtype == np.bool_ and next_obs.shape == (3, 10, 10, 4) and next_obs.dtype == np.bool_


def test_minatar_kwargs_reach_the_game():
    assert env_spec("MinAtar/SpaceInvaders-v1", {"sticky_action_prob": 0.0}).observation_space.shape == (10, 10, 6)
    with pytest.raises(EnvError, match="^config key 'env.kwargs': MinAtar/Breakout-v1 could not be built"):
        env_spec("MinAtar/Breakout-v1", {"no_such_setting": 1})


def test_an_atari_config_mistake_is_one_line_on_stderr_without_the_emulators_banner(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("algo: ppo\nmode: single\nenv: {id: ALE/Breakout-v5, kwargs: {mode: 99}}\n")
    out = subprocess.run([sys.executable, "-m", "distrl.cli", "train", str(config), "--run-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "distrl: error: config key 'env.kwargs': ALE/Breakout-v5 could not be built with {'mode': 99}: "
        "Invalid game mode requested"]
