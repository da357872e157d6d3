"""A rollout worker's job without the process around it: step envs, act, build fragments."""
from __future__ import annotations

import os
import time

import numpy as np

from distrl.core import Fragment, FragmentInfo, Policy, Trajectory
from distrl.envs import VectorEnv
from distrl.observe.trace import tracer


class Rollout:
    """Steps a vector of envs with batched inference and returns one fragment per call."""

    def __init__(self, policy: Policy, env_id: str, num_envs: int, fragment_length: int,
                 seed: int, worker_index: int, env_kwargs: dict | None = None):
        self.policy = policy
        self.envs = VectorEnv(env_id, num_envs, seed, env_kwargs)
        self.fragment_length = fragment_length
        self.worker_index = worker_index
        self.env_steps = 0
        self.fragments = 0

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
        """T steps of every env, then the fragment the policy makes of them (traced as one `sample` span)."""
        tr = tracer()
        with tr.span("sample", "rollout", env_steps=self.fragment_length * self.envs.num_envs):
            frag = self._sample(tr)
            self.fragments += 1
            frag.info.fragment_id = (os.getpid() << 24) + self.fragments  # names the transfer in traces
            tr.flow_out("fragment", frag.info.fragment_id)
        return frag

    def _sample(self, tr) -> Fragment:
        T, E, envs = self.fragment_length, self.envs.num_envs, self.envs
        buf = Buffers(T, envs.obs)
        returns, lengths = [], []
        t_act = t_env = 0.0
        errors_before, version = envs.env_errors, self.policy.version
        for t in range(T):
            t0 = time.time()
            self.policy.observe_steps(self.env_steps)
            a, ex = self.policy.act(envs.obs, explore=True)
            t1 = time.time()
            buf.put_action(t, envs.obs, a, ex)
            buf.next_obs[t], buf.rewards[t], buf.terminated[t], buf.truncated[t], finished = envs.step(a)
            self.policy.episodes_ended(buf.terminated[t] | buf.truncated[t])
            for ret, length in finished:
                returns.append(ret)
                lengths.append(length)
            self.env_steps += E
            t2 = time.time()
            tr.complete("inference", "inference", t0, t1 - t0)
            tr.complete("env_step", "env", t1, t2 - t1)
            t_env, t_act = t_env + t2 - t1, t_act + t1 - t0
        t0 = time.time()
        data, priorities = self.policy.postprocess(buf.trajectory())
        if "version" not in data:  # per item: flat (N,) for replay, (T, E) for trajectories
            data["version"] = np.full(data["rewards"].shape if "rewards" in data else (1,), version, np.int32)
        info = FragmentInfo(
            worker=self.worker_index, version=version, env_steps=T * E,
            episode_returns=np.asarray(returns, np.float64), episode_lengths=np.asarray(lengths, np.int64),
            timings={"env_s": t_env, "inference_s": t_act + time.time() - t0},
            env_errors=envs.env_errors - errors_before, pid=os.getpid(), items=len(data["version"]),
        )
        return Fragment(data, priorities, info)


class Buffers:
    """A fragment's time-major arrays, filled step by step; action and extras shapes come from the policy."""

    def __init__(self, T: int, obs: np.ndarray):
        self.obs = np.empty((T, *obs.shape), obs.dtype)
        self.next_obs = np.empty_like(self.obs)
        E = obs.shape[0]
        self.rewards = np.empty((T, E), np.float32)
        self.terminated = np.empty((T, E), bool)
        self.truncated = np.empty((T, E), bool)
        self.actions, self.extras = None, {}

    def put_action(self, t: int, obs: np.ndarray, actions: np.ndarray, extras: dict) -> None:
        if self.actions is None:
            T = len(self.obs)
            self.actions = np.empty((T, *actions.shape), actions.dtype)
            self.extras = {k: np.empty((T, *v.shape), v.dtype) for k, v in extras.items()}
        self.obs[t], self.actions[t] = obs, actions
        for k, v in extras.items():
            self.extras[k][t] = v

    def trajectory(self) -> Trajectory:
        return Trajectory(self.obs, self.actions, self.rewards, self.terminated, self.truncated,
                          self.next_obs, self.extras)
