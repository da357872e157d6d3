"""What the offline algorithms share: a dataset's steps as one trajectory, and their declaration base."""
from __future__ import annotations

import numpy as np

from distrl import tree
from distrl.algos.common import NetworkAlgorithm
from distrl.core import Batch, Trajectory


def dataset_trajectory(steps) -> Trajectory:
    """A dataset's episodes, one after another, as a (N, 1) trajectory of one env: n-step windows then stop
    at every episode's end, which is marked truncated where the dataset marked neither end."""
    ends = np.zeros(len(steps.rewards), bool)
    ends[np.asarray(steps.episode_ends) - 1] = True
    truncated = np.asarray(steps.truncated, bool) | (ends & ~np.asarray(steps.terminated, bool))
    col = lambda x: np.asarray(x)[:, None]  # noqa: E731 - one env
    return Trajectory(tree.map(col, steps.obs), col(steps.actions), col(steps.rewards).astype(np.float32),
                      col(steps.terminated).astype(bool), truncated[:, None], tree.map(col, steps.next_obs))


class OfflineAlgorithm(NetworkAlgorithm):
    """Learns from a dataset only (`data.dataset`): the replay is filled once from its steps, by
    `dataset_items`, and no rollout worker runs."""

    offline = True
    data_path = "replay"
    modes = ("single", "sync")  # async mode paces workers, and an offline run has none

    def dataset_items(self, steps) -> Batch:
        """The replay items of a dataset's steps (a `distrl.data.datasets.Transitions`)."""
        raise NotImplementedError
