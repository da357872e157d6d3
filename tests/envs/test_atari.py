"""Atari: DeepMind-style life loss (the episode ends, the game goes on), and the `atari` preset for
training and for evaluation envs."""
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import AtariPreprocessing

from distrl.envs import EnvError, VectorEnv, check_env, env_spec, make_env
from distrl.envs.atari import LifeLossEpisode
from distrl.roles.factory import spec_of
from distrl.config.sections import EnvConfig

BREAKOUT = "ALE/Breakout-v5"
NO_STICKY = {"repeat_action_probability": 0.0}  # deterministic games for the tests


def launch_and_wait(t: int) -> int:
    """Breakout: FIRE (launch the ball) every 10th step, else NOOP: a life is lost in ~25 steps."""
    return 1 if t % 10 == 0 else 0


def play_until_done(env: gym.Env, max_steps: int = 2000):
    for t in range(max_steps):
        obs, reward, terminated, truncated, info = env.step(launch_and_wait(t))
        if terminated or truncated:
            return t + 1, terminated, truncated
    raise AssertionError("no episode end")


def life_loss_env(**kwargs) -> LifeLossEpisode:
    base = make_env(BREAKOUT, {"frameskip": 1, **NO_STICKY, **kwargs})
    return LifeLossEpisode(AtariPreprocessing(base, noop_max=0))


def test_a_lost_life_ends_the_episode_and_the_next_reset_continues_the_game():
    env = life_loss_env()
    env.reset(seed=0)
    ale = env.unwrapped.ale
    assert ale.lives() == 5
    steps, terminated, truncated = play_until_done(env)
    assert terminated and not truncated and ale.lives() == 4 and not ale.game_over()
    frame = ale.getEpisodeFrameNumber()
    env.reset()
    # the same game, one no-op step (4 frames) on: not a new game
    assert ale.lives() == 4 and ale.getEpisodeFrameNumber() == frame + 4
    play_until_done(env)
    assert ale.lives() == 3


def test_a_game_over_resets_the_game():
    env = life_loss_env()
    env.reset(seed=0)
    ale = env.unwrapped.ale
    for lives_left in (4, 3, 2, 1, 0):
        play_until_done(env)
        assert ale.lives() == lives_left
        if lives_left:
            env.reset()
    assert ale.game_over()
    env.reset()
    assert ale.lives() == 5 and not ale.game_over() and ale.getEpisodeFrameNumber() == 0


def test_a_seeded_reset_after_a_lost_life_starts_a_new_game():
    env = life_loss_env()
    env.reset(seed=0)
    play_until_done(env)
    env.reset(seed=1)
    assert env.unwrapped.ale.lives() == 5 and env.unwrapped.ale.getEpisodeFrameNumber() == 0


def test_a_truncated_game_resets():
    env = life_loss_env(max_num_frames_per_episode=60)  # before the first life is lost
    env.reset(seed=0)
    _, terminated, truncated = play_until_done(env)
    assert truncated and env.unwrapped.ale.lives() == 5
    env.reset()
    assert env.unwrapped.ale.getEpisodeFrameNumber() == 0


def test_the_preset_gives_stacks_of_four_84x84_frames_zero_padded_at_the_start():
    spec = check_env(BREAKOUT, preset="atari")
    assert spec.observation_space.shape == (4, 84, 84) and spec.observation_space.dtype == np.uint8
    assert spec.frame_stack == 4
    assert spec_of(EnvConfig(id=BREAKOUT, preset="atari"), multi_agent=False).frame_stack == 4
    obs, _ = make_env(BREAKOUT, preset="atari").reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert not obs[:3].any() and obs[3].any()


def test_the_preset_keeps_the_games_sticky_actions_unless_the_user_sets_them():
    assert make_env(BREAKOUT, preset="atari").unwrapped.ale.getFloat("repeat_action_probability") == 0.25
    assert make_env(BREAKOUT, NO_STICKY, preset="atari").unwrapped.ale.getFloat("repeat_action_probability") == 0.0


def test_training_envs_end_episodes_on_a_lost_life_and_evaluation_envs_play_the_whole_game():
    training = VectorEnv(BREAKOUT, 1, 0, NO_STICKY, preset="atari", training=True)
    evaluation = VectorEnv(BREAKOUT, 1, 0, NO_STICKY, preset="atari", training=False)
    # (envs, lives once the first episode has ended and the vector reset the env)
    for envs, lives_after in ((training, 4), (evaluation, 5)):
        for t in range(3000):
            next_obs, rewards, term, trunc, finished = envs.step(np.array([launch_and_wait(t)]))
            if term[0] or trunc[0]:
                break
        assert term[0] and envs.envs[0].unwrapped.ale.lives() == lives_after
        assert next_obs[0, 3].any() and not np.array_equal(next_obs[0], envs.obs[0])  # the true final observation
        assert not envs.obs[0, :3].any()  # the next episode starts with a fresh (zero-padded) stack
    assert finished[0][1] > 4 * 20  # the evaluation episode lasted all five lives


def test_rewards_are_clipped_for_training_only():
    names = lambda env: {type(w).__name__ for w in _wrappers(env)}  # noqa: E731
    assert {"ClipReward", "LifeLossEpisode"} <= names(make_env(BREAKOUT, preset="atari", training=True))
    assert not {"ClipReward", "LifeLossEpisode"} & names(make_env(BREAKOUT, preset="atari", training=False))


def _wrappers(env):
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


@pytest.mark.parametrize("env_id, kwargs, message", [
    ("CartPole-v1", {}, r"^config key 'env.preset': atari needs an Atari env id such as ALE/Breakout-v5, got 'CartPole-v1'$"),
    (BREAKOUT, {"frameskip": 4}, r"^config key 'env.kwargs': frameskip=4 with env.preset atari"),
])
def test_the_preset_on_a_wrong_env_is_one_line(env_id, kwargs, message):
    with pytest.raises(EnvError, match=message):
        env_spec(env_id, kwargs, preset="atari")
