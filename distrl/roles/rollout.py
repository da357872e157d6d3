"""A rollout worker's job without the process around it: step envs, act, build fragments."""
from __future__ import annotations

import os
import time

import numpy as np

from distrl.core import Fragment, FragmentInfo, Policy, Trajectory
from distrl.envs import VectorEnv


class Rollout:
    """Steps a vector of envs with batched inference and returns one fragment per call."""

    def __init__(self, policy: Policy, env_id: str, num_envs: int, fragment_length: int,
                 seed: int, worker_index: int, env_kwargs: dict | None = None):
        self.policy = policy
        self.envs = VectorEnv(env_id, num_envs, seed, env_kwargs)
        self.fragment_length = fragment_length
        self.worker_index = worker_index
        self.env_steps = 0

    def get_state(self) -> dict:
        """Exploration and RNG state (JSON-exact). Env internals are not captured: on
        restore every env starts a fresh episode from its restored RNG. Workers act in numpy:
        no torch RNG to keep, and no torch import (A3C's gradients use no randomness)."""
        policy_rng = getattr(self.policy, "rng", None)
        return {
            "env_steps": self.env_steps,
            "policy_rng": policy_rng.bit_generator.state if policy_rng is not None else None,
            "env_rngs": [env.unwrapped.np_random.bit_generator.state for env in self.envs.envs],
        }

    def set_state(self, state: dict) -> None:
        self.env_steps = int(state["env_steps"])
        self.policy.observe_steps(self.env_steps)
        if state.get("policy_rng") is not None:
            self.policy.rng.bit_generator.state = state["policy_rng"]
        for env, rng_state in zip(self.envs.envs, state["env_rngs"]):
            env.unwrapped.np_random.bit_generator.state = rng_state
        self.envs.reset_all()
        self.policy.episodes_ended(np.ones(self.envs.num_envs, bool))

    def sample(self) -> Fragment:
        T, E = self.fragment_length, self.envs.num_envs
        envs = self.envs
        obs_shape = envs.obs.shape[1:]
        obs = np.empty((T, E, *obs_shape), envs.obs.dtype)
        next_obs = np.empty_like(obs)
        rewards = np.empty((T, E), np.float32)
        terminated = np.empty((T, E), bool)
        truncated = np.empty((T, E), bool)
        actions = None
        extras: dict[str, np.ndarray] = {}
        returns, lengths = [], []
        t_act = t_env = 0.0
        errors_before = envs.env_errors
        version = self.policy.version
        for t in range(T):
            t0 = time.perf_counter()
            self.policy.observe_steps(self.env_steps)
            a, ex = self.policy.act(envs.obs, explore=True)
            t1 = time.perf_counter()
            if actions is None:  # shapes/dtypes come from the policy's first answer
                actions = np.empty((T, *a.shape), a.dtype)
                extras = {k: np.empty((T, *v.shape), v.dtype) for k, v in ex.items()}
            obs[t] = envs.obs
            actions[t] = a
            for k, v in ex.items():
                extras[k][t] = v
            next_obs[t], rewards[t], terminated[t], truncated[t], finished = envs.step(a)
            self.policy.episodes_ended(terminated[t] | truncated[t])
            for ret, length in finished:
                returns.append(ret)
                lengths.append(length)
            self.env_steps += E
            t_env += time.perf_counter() - t1
            t_act += t1 - t0
        t0 = time.perf_counter()
        traj = Trajectory(obs, actions, rewards, terminated, truncated, next_obs, extras)
        data, priorities = self.policy.postprocess(traj)
        if "version" not in data:  # per item: flat (N,) for replay, (T, E) for trajectories
            data["version"] = np.full(data["rewards"].shape if "rewards" in data else (1,), version, np.int32)
        info = FragmentInfo(
            worker=self.worker_index, version=version, env_steps=T * E,
            episode_returns=np.asarray(returns, np.float64), episode_lengths=np.asarray(lengths, np.int64),
            timings={"env_s": t_env, "inference_s": t_act + time.perf_counter() - t0},
            env_errors=envs.env_errors - errors_before, pid=os.getpid(), items=len(data["version"]),
        )
        return Fragment(data, priorities, info)
