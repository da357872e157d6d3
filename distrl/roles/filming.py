"""Filming a policy: greedy episodes of the evaluation env rendered as rgb_array frames into an mp4
(`distrl eval --video`, and one evaluation episode every `eval.video_every_s` while training).

The episode is played in one env of its own, built with render_mode="rgb_array" (gymnasium, PettingZoo)
or rendered by the env itself (the MAPF gridworld's `render()`), so the frame after the last step, the
one showing how the episode ended, is in the video.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from distrl import tree
from distrl.core import Policy
from distrl.envs import EnvError
from distrl.observe.video import Mp4Writer, VideoError, check_frame, fps_of

MAX_STEPS = 100_000  # an episode that never ends is cut here


def render_env(env_cfg, multi_agent: bool, statistics: dict | None = None):
    """The evaluation env with rgb_array rendering, or VideoError saying why it cannot be filmed; it
    normalizes (env.normalize) with `statistics`, a policy's."""
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen; no display to look for
    kwargs = {**(env_cfg.kwargs or {}), "render_mode": "rgb_array"}
    if multi_agent:
        from distrl.envs.multiagent import make_multiagent_env

        try:
            env = make_multiagent_env(env_cfg.id, kwargs, env_cfg.obs_keys, env_cfg.action_mask)
        except EnvError:  # an env that renders itself takes no render_mode (the MAPF gridworld)
            env = make_multiagent_env(env_cfg.id, env_cfg.kwargs, env_cfg.obs_keys, env_cfg.action_mask)
        if not callable(getattr(env, "render", None)):
            env.close()
            raise VideoError(f"env {env_cfg.id} has no rgb_array rendering (no render() method)")
        return env
    from distrl.envs import make_env
    from distrl.envs.normalize import normalization_for

    try:
        return make_env(env_cfg.id, kwargs, wrappers=env_cfg.wrappers, preset=env_cfg.preset, training=False,
                        normalization=normalization_for(env_cfg.normalize, False, statistics),
                        obs_keys=env_cfg.obs_keys, action_mask=env_cfg.action_mask)
    except EnvError as e:
        raise VideoError(f"env {env_cfg.id} has no rgb_array rendering: {e}") from None


def _batch(step, space, multi_agent: bool):
    """One env's observation as a batch of one, as a vector env would give it."""
    if multi_agent:
        from distrl.envs.multiagent_vector import policy_fields

        return tree.map(lambda v: np.asarray(v)[None], policy_fields(step))
    return np.asarray(step)[None].astype(space.dtype or np.float32, copy=False)


def film_episode(policy: Policy, env, env_id: str, seed: int, writer: Mp4Writer, multi_agent: bool,
                 max_steps: int = MAX_STEPS) -> tuple[float, dict]:
    """Play one greedy episode of `env` (seeded `seed`), adding every frame to `writer`: (its return, the
    episode's metrics: multi-agent envs report them). The return of a multi-agent episode is the mean over
    its agents."""
    policy.episodes_ended(np.ones(1, bool))
    if multi_agent:
        step = env.reset(seed=seed)
        obs, total = step, np.zeros(env.num_agents)
    else:
        obs, _ = env.reset(seed=seed)
        total = 0.0
    writer.add(check_frame(env.render(), env_id))
    info: dict = {}
    for _ in range(max_steps):
        actions, _ = policy.act(_batch(obs, env.observation_space, multi_agent), explore=False)
        if multi_agent:
            obs = env.step(actions[0])
            total, done, info = total + obs.rewards, obs.terminated or obs.truncated, obs.info
        else:
            obs, reward, term, trunc, _ = env.step(actions[0])
            total, done = total + float(reward), term or trunc
        policy.episodes_ended(np.array([done]))
        writer.add(check_frame(env.render(), env_id))
        if done:
            break
    return float(np.mean(total)), {k: float(v) for k, v in info.items() if isinstance(v, (int, float))}


def film_greedy(policy: Policy, env_cfg, episodes: int, seed: int, path: str,
                multi_agent: bool) -> tuple[np.ndarray, list[dict], int]:
    """`episodes` greedy episodes one after another into the mp4 at `path` (episode i seeded seed + i):
    (their returns, their metrics, frames written). Nothing is left at `path` if filming fails."""
    env = render_env(env_cfg, multi_agent, policy.statistics)
    writer = Mp4Writer(path, fps_of(env))
    returns, infos = [], []
    try:
        for i in range(episodes):
            ret, info = film_episode(policy, env, env_cfg.id, seed + i, writer, multi_agent)
            returns.append(ret)
            infos.append(info)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        env.close()
    return np.array(returns), infos, writer.frames


def evaluation_video(policy: Policy, env_cfg, seed: int, multi_agent: bool) -> dict:
    """One greedy episode filmed for a run's evaluation: {"mp4": bytes, "gif": bytes, "gif_size": (h, w),
    "frames", "return"}, bytes so that an evaluator on another node can hand it to the driver."""
    env = render_env(env_cfg, multi_agent, policy.statistics)
    with tempfile.TemporaryDirectory() as d:
        writer = Mp4Writer(os.path.join(d, "episode.mp4"), fps_of(env))
        try:
            ret, _ = film_episode(policy, env, env_cfg.id, seed, writer, multi_agent)
            with open(writer.close(), "rb") as fh:
                mp4 = fh.read()
        finally:
            writer.abort()
            env.close()
        gif, h, w = writer.gif()
    return {"mp4": mp4, "gif": gif, "gif_size": (h, w), "frames": writer.frames, "return": ret}


def check_filmable(env_cfg, multi_agent: bool) -> None:
    """VideoError (a ConfigError naming eval.video_every_s) when the env (`env` section) cannot render
    rgb_array frames; checked before a run that asks for videos starts."""
    try:
        env = render_env(env_cfg, multi_agent)
        try:
            env.reset(seed=0)
            check_frame(env.render(), env_cfg.id)
        finally:
            env.close()
    except VideoError as e:
        raise VideoError(f"config key 'eval.video_every_s': {e}") from None


def check_outputs(log_cfg, eval_cfg, env_cfg, multi_agent: bool) -> None:
    """Before a run starts: the trackers it logs to (`log` section) are installed, and the env it films
    (when `eval.video_every_s` is set) renders frames (ConfigError naming the key otherwise)."""
    from distrl.observe.trackers import check_installed

    check_installed(log_cfg)
    if eval_cfg.video_every_s is not None:
        check_filmable(env_cfg, multi_agent)
