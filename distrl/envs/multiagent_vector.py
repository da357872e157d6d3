"""A vector of multi-agent envs stepped in one process, with the same step interface as `VectorEnv`.

What the policy acts on, `obs`, is a dict of (E, ...) arrays: `obs` (E, N, *obs_shape; a tree of such
arrays for a structured observation, `distrl.tree`), `comm_mask`
(E, N, N), `active` (E, N) and, for an env with a global state (`MAStep.state`) stepped `with_state`,
`global_state` (E, *state_shape): only a policy that reads it has it sent to its inference and fragments. `step` returns the true next observation of every env as such a dict (the final one
where an episode ended, before the env is reset for the next act), per-agent rewards (E, N), the
episode's terminated and truncated flags (E,), and the episodes that ended.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from distrl import tree
from distrl.envs.multiagent import MAStep, make_multiagent_env


def _stored(x) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.float32, copy=False) if x.dtype.kind == "f" else x


def policy_fields(step: MAStep, with_state: bool = True) -> dict[str, np.ndarray]:
    """One env's step as the policy reads it (unstacked: the module docstring's dict without E)."""
    fields = {"obs": tree.map(_stored, step.obs), "comm_mask": step.comm_mask, "active": step.active}
    if with_state and step.state is not None:
        fields["global_state"] = step.state
    return fields


class MultiAgentVectorEnv:
    """E multi-agent envs; env i is seeded with `seed + i` on its first reset; `with_state`: observations
    hold the env's global state where it has one; `obs_keys`, `action_mask`: env.obs_keys, env.action_mask."""

    def __init__(self, env_id: str, num_envs: int, seed: int, kwargs: dict[str, Any] | None = None,
                 with_state: bool = True, obs_keys: list | None = None, action_mask: str = "auto"):
        self.with_state = with_state
        self.envs = [make_multiagent_env(env_id, kwargs, obs_keys, action_mask) for _ in range(num_envs)]
        self.num_envs = num_envs
        self.num_agents = self.envs[0].num_agents
        self.observation_space, self.action_space = self.envs[0].observation_space, self.envs[0].action_space
        self.obs = self._stack([env.reset(seed=seed + i) for i, env in enumerate(self.envs)])
        self.episode_return = np.zeros((num_envs, self.num_agents), np.float64)
        self.episode_length = np.zeros(num_envs, np.int64)
        self.episode_return_at_end = np.zeros(num_envs, np.float64)
        self.episode_info: list[dict] = [{} for _ in range(num_envs)]  # each env's last finished episode
        self.env_errors = 0
        self.errored = np.zeros(num_envs, bool)

    def _stack(self, steps: list[MAStep]) -> dict[str, np.ndarray]:
        return tree.stack([policy_fields(s, self.with_state) for s in steps])

    @staticmethod
    def fields(obs: dict, prefix: str) -> dict:
        """A step's observations as the per-step fields a fragment stores: each of `obs`'s (obs,
        comm_mask, active, global_state)."""
        return {prefix + k: v for k, v in obs.items()}

    def rng_states(self) -> list[dict]:
        """Not captured: a multi-agent env's internals are its own; a restored worker's envs reseed
        from their RNGs as they are (so a resumed run is not bit-identical, only continuous)."""
        return []

    def set_rng_states(self, states: list[dict]) -> None:
        pass

    def reset_all(self) -> None:
        """Start a fresh episode in every env (each env's own RNG carries on)."""
        self.obs = self._stack([env.reset() for env in self.envs])
        self.episode_return[:] = 0.0
        self.episode_length[:] = 0

    def _step_one(self, i: int, actions: np.ndarray) -> MAStep:
        """One env's step; an exception or a non-finite output ends its episode as a truncation (counted)."""
        try:
            step = self.envs[i].step(actions)
            finite = [step.rewards, step.obs] + ([] if step.state is None else [step.state])
            if not all(tree.all_finite(x) for x in finite):
                raise FloatingPointError("non-finite observation, state or reward")
            return step
        except Exception:  # noqa: BLE001 - any env bug: end the episode, keep the run going
            self.env_errors += 1
            self.errored[i] = True
            n = self.num_agents
            last = tree.index(self.obs, i)
            return MAStep(last["obs"], np.zeros(n, np.float32), False, True, last["active"], last["comm_mask"], {},
                          last.get("global_state"))

    def step(self, actions: np.ndarray):
        """(next observations (dict), rewards (E, N), terminated (E,), truncated (E,), finished [(return, length)])."""
        self.errored = np.zeros(self.num_envs, bool)
        steps = [self._step_one(i, actions[i]) for i in range(self.num_envs)]
        nxt = self._stack(steps)
        rewards = np.stack([s.rewards for s in steps]).astype(np.float32)
        terminated = np.array([s.terminated for s in steps])
        truncated = np.array([s.truncated for s in steps])
        self.episode_return += rewards
        self.episode_length += 1
        finished, now = [], tree.copy(nxt)
        for i in np.flatnonzero(terminated | truncated):
            ret = float(self.episode_return[i].mean())  # an episode's return: the mean over its agents
            finished.append((ret, int(self.episode_length[i])))
            self.episode_return_at_end[i] = ret
            self.episode_info[i] = dict(steps[i].info, return_mean=ret)
            self.episode_return[i], self.episode_length[i] = 0.0, 0
            tree.assign(now, i, policy_fields(self.envs[i].reset(), self.with_state))
        self.obs = now
        return nxt, rewards, terminated, truncated, finished

    def close(self) -> None:
        for env in self.envs:
            env.close()
