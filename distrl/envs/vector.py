"""A vector of gymnasium envs stepped in one process, with same-step auto-reset.

We keep our own small loop instead of gymnasium's SyncVectorEnv because the
learner needs the *true* final observation of every episode (for bootstrapping
truncated episodes) in the same array as ordinary next observations.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from distrl import tree
from distrl.envs.factory import make_env
from distrl.envs.normalize import RAW_REWARD, normalization_for


class VectorEnv:
    """E envs; env i is seeded with `seed + i` on its first reset. `wrappers`, `preset` and `training`
    are `make_env`'s: a rollout worker's envs are training envs, the evaluator's are not. `normalize` (the
    env.normalize section): the envs share one `Normalization` (`self.normalization`), whose statistics
    `weights` set (published weights; an evaluator's envs start from them)."""

    def __init__(self, env_id: str, num_envs: int, seed: int, kwargs: dict[str, Any] | None = None, *,
                 wrappers: list | None = None, preset: str = "none", training: bool = True, normalize=None,
                 weights: dict | None = None, obs_keys: list | None = None, action_mask: str = "none"):
        self.normalization = normalization_for(normalize, training, weights)
        self.envs = [make_env(env_id, kwargs, wrappers=wrappers, preset=preset, training=training,
                              normalization=self.normalization, obs_keys=obs_keys, action_mask=action_mask)
                     for _ in range(num_envs)]
        self.num_envs = num_envs
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self.env_errors = 0
        first = [self._reset(env, seed=seed + i) for i, env in enumerate(self.envs)]
        for i, env in enumerate(self.envs):
            env.action_space.seed(seed + i)
        # A structured observation's leaves are in their stored dtypes already (envs.structured).
        self.obs = tree.stack(first) if tree.is_structured(self.observation_space) else \
            np.stack(first).astype(self.observation_space.dtype or np.float32, copy=False)
        self.episode_return = np.zeros(num_envs, np.float64)
        self.episode_length = np.zeros(num_envs, np.int64)
        self.episode_return_at_end = np.zeros(num_envs, np.float64)
        self.errored = np.zeros(num_envs, bool)  # which envs raised during the last step

    @staticmethod
    def fields(obs, prefix: str) -> dict:
        """A step's observations as the per-step fields a fragment stores: one, `obs` (a tree for a
        structured observation)."""
        return {prefix + "obs": obs}

    def rng_states(self) -> list[dict]:
        """Each env's RNG state (JSON-exact), for a worker's checkpoint."""
        return [env.unwrapped.np_random.bit_generator.state for env in self.envs]

    def set_rng_states(self, states: list[dict]) -> None:
        for env, state in zip(self.envs, states):
            env.unwrapped.np_random.bit_generator.state = state

    def load_statistics(self, weights: dict) -> None:
        """Normalize with the env.normalize statistics inside `weights` from now on, the observations to act on
        next included."""
        self.normalization.load(weights)
        if self.normalization.cfg.obs:
            self.obs = tree.stack([env.get_wrapper_attr("renormalized")() for env in self.envs])

    def reset_all(self) -> None:
        """Start a fresh episode in every env (without reseeding: RNG state carries on)."""
        fresh = tree.stack([self._reset(env) for env in self.envs])
        self.obs = tree.map(lambda new, old: new.astype(old.dtype, copy=False), fresh, self.obs)
        self.episode_return[:] = 0.0
        self.episode_length[:] = 0

    def step(self, actions: np.ndarray):
        """Step every env once.

        Returns (next_obs, rewards, terminated, truncated, finished) where
        next_obs holds true next observations; `self.obs` afterwards holds the
        observations to act on next (reset ones where an episode ended), and
        `finished` lists (return, length) of episodes that ended.
        """
        n = self.num_envs
        next_obs = tree.map(np.empty_like, self.obs)
        rewards = np.empty(n, np.float32)
        terminated = np.empty(n, bool)
        truncated = np.empty(n, bool)
        finished = []
        self.errored = np.zeros(n, bool)
        for i, env in enumerate(self.envs):
            try:
                o, r, te, tr, info = env.step(actions[i])
                raw = info.get(RAW_REWARD, r)  # returns are counted in the env's own rewards
                if not (np.isfinite(r) and tree.all_finite(o)):
                    raise FloatingPointError("non-finite observation or reward")
            except Exception:  # noqa: BLE001 - any env bug: end the episode, keep the run going
                # Counted and treated as a truncation at the last good observation (a non-finite
                # observation or reward too: it would poison replay and then the weights).
                self.env_errors += 1
                self.errored[i] = True
                o, r, te, tr, raw = tree.copy(tree.index(self.obs, i)), 0.0, False, True, 0.0
            tree.assign(next_obs, i, o)
            rewards[i] = r
            terminated[i] = te
            truncated[i] = tr
            if te or tr:
                finished.append((self.episode_return[i] + raw, self.episode_length[i] + 1))
                self.episode_return_at_end[i] = self.episode_return[i] + raw
                self.episode_return[i] = 0.0
                self.episode_length[i] = 0
                o = self._reset(env)
            else:
                self.episode_return[i] += raw
                self.episode_length[i] += 1
            tree.assign(self.obs, i, o)
        return next_obs, rewards, terminated, truncated, finished

    def _reset(self, env, **kwargs) -> np.ndarray:
        """A reset's observation, which must be finite: a few tries, each counted as an env error. A reset
        that raises or keeps failing is not recoverable here: the worker's process restarts."""
        for _ in range(3):
            obs, _ = env.reset(**kwargs)
            if tree.all_finite(obs):
                return obs
            self.env_errors += 1
        raise FloatingPointError("the env's reset keeps returning non-finite observations")

    def close(self) -> None:
        for env in self.envs:
            env.close()
