"""Cutting a vector of envs' steps into whole episodes, as a dataset stores them."""
from __future__ import annotations

import numpy as np

from distrl import tree
from distrl.data.datasets import Episode


class EpisodeRecorder:
    """Follows E envs step by step; an episode comes out whole when it ends, with its T + 1 observations
    (the last being the true final one, the one after reset starts the next episode)."""

    def __init__(self, first_obs):
        self.open: list[dict[str, list]] = self._fresh(first_obs)

    @staticmethod
    def _fresh(obs) -> list[dict[str, list]]:
        """An episode opened per env of `obs` (a tree of arrays, env axis first: `distrl.tree`)."""
        return [EpisodeRecorder._new(tree.index(obs, i)) for i in range(tree.rows(obs))]

    @staticmethod
    def _new(obs) -> dict[str, list]:
        return {"obs": [tree.copy(tree.as_arrays(obs))], "actions": [], "rewards": [], "term": [], "trunc": []}

    def step(self, actions, rewards, terminated, truncated, next_obs, obs_after) -> list[Episode]:
        """One step of every env: `next_obs` the true next observations, `obs_after` what each env shows next
        (a reset observation where its episode ended). The episodes that ended, whole."""
        done = []
        for i, ep in enumerate(self.open):
            ep["actions"].append(np.array(actions[i]))
            ep["rewards"].append(float(rewards[i]))
            ep["term"].append(bool(terminated[i]))
            ep["trunc"].append(bool(truncated[i]))
            ep["obs"].append(tree.copy(tree.index(next_obs, i)))
            if terminated[i] or truncated[i]:
                done.append(Episode(tree.stack(ep["obs"]), np.stack(ep["actions"]),
                                    np.asarray(ep["rewards"], np.float64), np.asarray(ep["term"], bool),
                                    np.asarray(ep["trunc"], bool)))
                self.open[i] = self._new(tree.index(obs_after, i))
        return done

    def restart(self, obs: np.ndarray) -> None:
        """Every env starts a fresh episode (a worker restored from a checkpoint): open ones are dropped."""
        self.open = self._fresh(obs)
