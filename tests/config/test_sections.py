"""The env section: `env.wrappers` and `env.preset` from YAML and overrides, their mistakes one line
naming the key (exit 2 through the CLI)."""
import os

import pytest

from distrl.checks import validate
from distrl.cli import main
from distrl.config import ConfigError, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SINGLE = ["mode=single", "algo=ppo"]  # single mode: validating starts no Ray


def test_wrappers_and_preset_load_from_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  id: ALE/Breakout-v5\n  preset: atari\n  wrappers:\n"
                    "    - {TimeLimit: {max_episode_steps: 1000}}\n"
                    "    - {ClipReward: {min_reward: -1, max_reward: 1}, train_only: true}\n"
                    "    - RecordEpisodeStatistics\n")
    cfg = load_config(str(path))
    assert cfg.env.preset == "atari"
    assert cfg.env.wrappers == [{"TimeLimit": {"max_episode_steps": 1000}},
                                {"ClipReward": {"min_reward": -1, "max_reward": 1}, "train_only": True},
                                "RecordEpisodeStatistics"]
    assert load_config(None).env.wrappers == [] and load_config(None).env.preset == "none"


@pytest.mark.parametrize("overrides, message", [
    (["env.preset=dqn"], "config key 'env.preset': must be one of none, atari, got 'dqn'"),
    (["env.wrappers=ClipReward"], "config key 'env.wrappers': expected list"),
    (["env.wrappers=[FrameStack]"], "config key 'env.wrappers[0]': unknown gymnasium wrapper 'FrameStack'"),
    (["env.wrappers=[{TimeLimit: {max_episode_steps: 5}}, {TimeLimit: {steps: 5}}]"],
     "config key 'env.wrappers[1]': TimeLimit: missing a required argument"),
    (["env.preset=atari"], "config key 'env.preset': atari needs an Atari env id"),
    (["env.id=ALE/NoSuchGame-v5"], "config key 'env.id': unknown gymnasium environment 'ALE/NoSuchGame-v5'"),
])
def test_env_mistakes_are_one_config_error_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        validate(load_config(None, SINGLE + overrides))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_bad_wrapper_exits_2_with_one_line(capsys, tmp_path):
    code = main(["train", os.path.join(ROOT, "configs", "ppo_cartpole.yaml"), "--run-dir", str(tmp_path / "run"), "--set", "mode=single",
                 "--set", "env.wrappers=[{NoSuchWrapper: {}}]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "env.wrappers[0]" in err[0]
    assert not (tmp_path / "run").exists()


def test_multi_agent_envs_refuse_wrappers_naming_the_key():
    cfg = load_config(None, ["mode=single", "algo=dhc", "env.id=distrl.envs.mapf:MAPF", "env.preset=atari"])
    with pytest.raises(ConfigError, match="^config key 'env.preset': multi-agent envs take no gymnasium wrappers"):
        validate(cfg)
