"""A rollout worker's job without the process around it: step envs, act, build fragments."""
from __future__ import annotations

import os
import time

import numpy as np

from distrl import tree
from distrl.core import Fragment, FragmentInfo, Policy, Trajectory
from distrl.data.recorder import EpisodeRecorder
from distrl.observe.trace import tracer


class Rollout:
    """Steps a vector of envs with batched inference and returns one fragment per call.

    With multi-agent envs the policy acts on a dict (obs, comm_mask, active, global_state) and the fragment
    carries those for every step and, as next_*, for the one after.
    """

    def __init__(self, policy: Policy, envs, fragment_length: int, worker_index: int, record: bool = False):
        self.policy, self.envs = policy, envs  # a VectorEnv or MultiAgentVectorEnv (roles.factory.make_rollout)
        self.fragment_length = fragment_length
        self.worker_index = worker_index
        self.env_steps = 0
        self.fragments = 0
        # log.dataset: whole episodes travel with the fragment's info to the driver, the dataset's one writer
        self.recorder = EpisodeRecorder(envs.obs) if record else None
        self.normalization = getattr(envs, "normalization", None)  # env.normalize: the envs' shared one
        self.statistics_version = None  # the policy version whose statistics the envs normalize with

    def close(self) -> None:
        """Close the envs: a simulator running in a process of its own (VizDoom's game) ends with them."""
        self.envs.close()

    def get_state(self) -> dict:
        """Exploration and RNG state (JSON-exact). Env internals are not captured: on
        restore every env starts a fresh episode from its restored RNG. Workers act in numpy:
        no torch RNG to keep, and no torch import (A3C's gradients use no randomness)."""
        policy_rng = getattr(self.policy, "rng", None)
        return {
            "env_steps": self.env_steps,
            "policy_rng": policy_rng.bit_generator.state if policy_rng is not None else None,
            "env_rngs": self.envs.rng_states(),
        }

    def set_state(self, state: dict) -> None:
        self.env_steps = int(state["env_steps"])
        self.policy.observe_steps(self.env_steps)
        if state.get("policy_rng") is not None:
            self.policy.rng.bit_generator.state = state["policy_rng"]
        self.envs.set_rng_states(state["env_rngs"])
        self.envs.reset_all()
        self.policy.episodes_ended(np.ones(self.envs.num_envs, bool))
        if self.recorder is not None:
            self.recorder.restart(self.envs.obs)

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
        if self.normalization is not None and self.statistics_version != self.policy.version:
            self.envs.load_statistics(self.policy.statistics)  # those the weights came with
            self.statistics_version = self.policy.version
        buf = Buffers(T)
        returns, lengths, episodes = [], [], []
        t_act = t_env = 0.0
        errors_before, version = envs.env_errors, self.policy.version
        for t in range(T):
            t0 = time.time()
            self.policy.observe_steps(self.env_steps)
            obs = envs.obs
            a, ex = self.policy.act(obs, explore=True)
            t1 = time.time()
            buf.put(t, **envs.fields(obs, ""), actions=a, **ex)  # before the step: VectorEnv updates obs in place
            nxt, rewards, terminated, truncated, finished = envs.step(a)
            buf.put(t, rewards=rewards, terminated=terminated, truncated=truncated, **envs.fields(nxt, "next_"))
            if self.recorder is not None:
                episodes += self.recorder.step(a, rewards, terminated, truncated, nxt, envs.obs)
            self.policy.episodes_ended(terminated | truncated)
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
            episodes=episodes, statistics=self.normalization.take() if self.normalization is not None else None,
        )
        return Fragment(data, priorities, info)


class Buffers:
    """A fragment's time-major arrays (trees of them for a structured observation: `distrl.tree`), each
    allocated at its first step from that step's shapes and dtypes."""

    CORE = ("obs", "actions", "rewards", "terminated", "truncated", "next_obs")

    def __init__(self, T: int):
        self.T = T
        self.arrays: dict[str, np.ndarray] = {}

    def put(self, t: int, **fields: np.ndarray) -> None:
        for k, v in fields.items():
            v = tree.as_arrays(v)
            if k not in self.arrays:
                self.arrays[k] = tree.empty((self.T,), v)
            tree.assign(self.arrays[k], t, v)

    def trajectory(self) -> Trajectory:
        a = self.arrays
        extras = {k: v for k, v in a.items() if k not in self.CORE}
        return Trajectory(a["obs"], a["actions"], a["rewards"], a["terminated"], a["truncated"], a["next_obs"], extras)
