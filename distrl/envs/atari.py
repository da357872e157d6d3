"""Atari: the `env.preset: atari` preprocessing, and DeepMind-style life loss as a training episode's end.

The preset is the standard DQN setup (Mnih et al. 2015, with Machado et al. 2018's sticky actions):

- all envs: `AtariPreprocessing` (up to 30 no-op starts, the action repeated 4 frames with the max over
  the last 2, 84x84 grayscale, uint8), then `FrameStackObservation` of 4 frames, zero-padded at an
  episode's start (as ale-py's own vector env and Dopamine's replay do);
- rollout workers' envs only: `LifeLossEpisode` (below) and `ClipReward` to [-1, 1], so the evaluator
  (and `distrl eval`) score full games with the game's own rewards.

The base env is made with `frameskip=1` (AtariPreprocessing skips frames itself). Sticky actions stay
the game's own (`repeat_action_probability` 0.25 for the `-v5` ids, 0 for `-v4`/`NoFrameskip`) unless
`env.kwargs` sets them.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation

from distrl.envs.errors import EnvError
from distrl.envs.wrappers import WrapperSpec

ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"
STACK = 4


class LifeLossEpisode(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """A lost life ends the episode (`terminated=True`: no bootstrapping past it) without ending the game.

    The reset after a life loss does not restart the game: it takes one no-op step (action 0) and the
    next episode starts from there with the lives left. A real game over (or a truncation, or a seeded
    reset) resets the game. Written here because gymnasium's `terminal_on_life_loss` and ale-py's
    `episodic_life` both restart the whole game after a life loss, so an agent would rarely see the
    later parts of a game.
    """

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)  # gymnasium's env checker re-creates the wrapper stack
        gym.Wrapper.__init__(self, env)
        if not hasattr(env.unwrapped, "ale"):
            raise TypeError("LifeLossEpisode needs an Atari (ale-py) env")
        self.lives = 0
        self.life_lost = False  # the last step lost a life and the game goes on: the next reset continues it

    def _lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self._lives()
        self.life_lost = lives < self.lives and not (terminated or truncated)
        self.lives = lives
        return obs, reward, terminated or self.life_lost, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.life_lost and seed is None and options is None:
            self.life_lost = False
            obs, _, terminated, truncated, info = self.env.step(0)
            if not (terminated or truncated):  # else the no-op ended the game: reset it after all
                self.lives = self._lives()
                return obs, info
        self.life_lost = False
        obs, info = self.env.reset(seed=seed, options=options)
        self.lives = self._lives()
        return obs, info


def atari_wrappers() -> list[WrapperSpec]:
    """The preset's wrappers, in order (the train-only ones marked)."""
    key = "env.preset"
    return [
        WrapperSpec(AtariPreprocessing, {"noop_max": 30, "frame_skip": 4, "screen_size": 84,
                                         "terminal_on_life_loss": False, "grayscale_obs": True,
                                         "scale_obs": False}, key=key),
        WrapperSpec(LifeLossEpisode, train_only=True, key=key),
        WrapperSpec(ClipReward, {"min_reward": -1.0, "max_reward": 1.0}, train_only=True, key=key),
        WrapperSpec(FrameStackObservation, {"stack_size": STACK, "padding_type": "zero"}, key=key),
    ]


def is_atari_id(env_id: str) -> bool | None:
    """Whether a registered id is an ale-py game (None: not a registered id, so unknown before it is built)."""
    spec = gym.envs.registry.get(env_id)
    return None if spec is None else spec.entry_point == ATARI_ENTRY_POINT


def atari_base_kwargs(env_id: str, kwargs: dict | None) -> dict:
    """The base env's kwargs under the preset: frame skipping off (the preset skips frames itself)."""
    if is_atari_id(env_id) is False:
        raise EnvError(f"config key 'env.preset': atari needs an Atari env id such as ALE/Breakout-v5, got {env_id!r}")
    kwargs = dict(kwargs or {})
    if kwargs.get("frameskip", 1) != 1:
        raise EnvError(f"config key 'env.kwargs': frameskip={kwargs['frameskip']!r} with env.preset atari, which "
                       "skips 4 frames itself; drop frameskip (or write your own env.wrappers)")
    kwargs["frameskip"] = 1
    return kwargs


def check_atari(env: gym.Env, env_id: str) -> None:
    if not hasattr(env.unwrapped, "ale"):
        raise EnvError(f"config key 'env.preset': atari needs an Atari (ale-py) env, {env_id!r} is not one")
