"""A simulator that owns its loop, as a user's would: a gymnasium env (or `--envs` of them side by side)
stepped by this process, acting through `distrl.client` (remote or local inference). Benchmarks and tests start several as OS processes.

    python -m bench.external_sim RUN_DIR [--inference local] [--seconds 60] [--seed 0] [--envs 1]

The env is built as the run builds env.id (`distrl.envs.make_env`: a `module:Class` id, a Dict or Tuple
observation as a tree of arrays, its action mask as the `action_mask` leaf by `--action-mask`), so what it
sends is the observation the run's spaces declare. It waits for the run's address file
(`Client.from_run_dir`), plays episodes until `--seconds` or `--episodes`, and prints one JSON line: steps,
episodes, seconds, mean return, and the actions it took that its observation's mask forbade.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
from gymnasium import spaces

from distrl import tree
from distrl.client import Client
from distrl.envs import make_env


def forbidden(obs, action, space) -> bool:
    """Whether the observation's action mask (if any) forbids `action` (each factor's value, for a
    MultiDiscrete or MultiBinary one: masks concatenated factor after factor)."""
    mask = tree.mask_of(obs)
    if mask is None:
        return False
    if isinstance(space, spaces.Discrete):
        return not mask[int(action)]
    nvec = np.asarray(getattr(space, "nvec", np.full(space.shape, 2))).reshape(-1)
    choices = np.asarray(action).reshape(-1) - np.asarray(getattr(space, "start", 0)).reshape(-1)
    return not mask[np.cumsum(nvec) - nvec + choices].all()


def play(client: Client, env, seconds: float, episodes: int, seed: int) -> dict:
    steps = done = masked = 0
    returns, start, error = [], time.time(), None
    try:
        while time.time() - start < seconds and done < episodes:
            obs, _ = env.reset(seed=seed + done)
            episode, total = client.start_episode(), 0.0
            while True:
                action = client.get_action(episode, obs)
                masked += forbidden(obs, action, env.action_space)
                obs, reward, terminated, truncated, _ = env.step(action)
                client.log_returns(episode, reward)
                steps, total = steps + 1, total + reward
                if terminated or truncated:
                    client.end_episode(episode, obs, truncated=truncated and not terminated)
                    break
            done += 1
            returns.append(total)
    except ConnectionError as e:  # the run ended (its server went away for good)
        error = str(e)
    return {"steps": steps, "episodes": done, "seconds": round(time.time() - start, 3),
            "return_mean": sum(returns[-20:]) / max(1, len(returns[-20:])), "masked_actions": masked,
            "error": error}


def play_many(client: Client, envs: list, seconds: float, seed: int) -> dict:
    """`envs` stepped side by side, one episode open in each, their actions asked for at once
    (`Client.get_actions`), as a simulator running many instances would."""
    steps = done = masked = 0
    returns, start, error = [], time.time(), None
    try:
        obs = [env.reset(seed=seed + 1000 * i)[0] for i, env in enumerate(envs)]
        episodes, totals = [client.start_episode() for _ in envs], [0.0] * len(envs)
        while time.time() - start < seconds:
            actions = client.get_actions(episodes, tree.stack(obs))
            for i, env in enumerate(envs):
                masked += forbidden(obs[i], actions[i], env.action_space)
                obs[i], reward, terminated, truncated, _ = env.step(actions[i])
                client.log_returns(episodes[i], reward)
                steps, totals[i] = steps + 1, totals[i] + reward
                if terminated or truncated:
                    client.end_episode(episodes[i], obs[i], truncated=truncated and not terminated)
                    done += 1
                    returns.append(totals[i])
                    obs[i], totals[i] = env.reset()[0], 0.0
                    episodes[i] = client.start_episode()
    except ConnectionError as e:
        error = str(e)
    return {"steps": steps, "episodes": done, "seconds": round(time.time() - start, 3),
            "return_mean": sum(returns[-20:]) / max(1, len(returns[-20:])), "masked_actions": masked,
            "error": error}


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--env", default="CartPole-v1", help="an env.id, built as the run builds it")
    p.add_argument("--action-mask", default="auto", help="env.action_mask: auto, info, obs or none")
    p.add_argument("--inference", default="remote", choices=["remote", "local"])
    p.add_argument("--encoding", default="msgpack", choices=["msgpack", "json"])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--episodes", type=int, default=10**9, help="(one env) episodes to play")
    p.add_argument("--envs", type=int, default=1, help="envs stepped side by side, acting through get_actions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights-interval", type=float, default=2.0)
    p.add_argument("--send-steps", type=int, default=None,
                   help="local inference: steps per experience message (default: the client's)")
    p.add_argument("--reconnect", type=float, default=60.0, help="seconds a lost server is waited for")
    a = p.parse_args(argv)
    client = Client.from_run_dir(a.run_dir, inference=a.inference, encoding=a.encoding, seed=a.seed,
                                 weights_interval_s=a.weights_interval, send_steps=a.send_steps,
                                 reconnect_s=a.reconnect)
    try:
        if a.envs > 1:
            out = play_many(client, [make_env(a.env, action_mask=a.action_mask) for _ in range(a.envs)],
                            a.seconds, a.seed)
        else:
            out = play(client, make_env(a.env, action_mask=a.action_mask), a.seconds, a.episodes, a.seed)
    finally:
        client.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
