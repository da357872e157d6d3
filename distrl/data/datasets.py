"""Experience datasets in Minari's format (the gymnasium ecosystem's), local only: nothing is downloaded.

A dataset is a directory `.../<name>-vN/` holding `data/metadata.json` and `data/main_data.hdf5`, as
`minari.load_dataset` expects under MINARI_DATASETS_PATH. distrl writes through Minari's storage API
(`MinariStorage`) rather than its `DataCollector`, which needs jax; a dataset written here opens with
`minari.load_dataset`, and one written with Minari's own API trains here.

Episodes are numpy arrays: `observations` (T + 1 rows: the last is the final observation, so a truncated
episode bootstraps from it), `actions`, `rewards`, `terminations`, `truncations` (T rows). One process
writes a dataset (HDF5 locks the file): workers send episodes, the driver appends them.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from distrl import tree

NAME = re.compile(r"^[A-Za-z0-9_.-]+-v\d+$")


class DatasetError(ValueError):
    """A dataset that is missing, unreadable or does not fit the run (one line for the user)."""


def dataset_dir(path_or_id: str) -> str:
    """The directory holding a dataset's `data/`: an existing (or absolute, or ./relative) directory, else
    a Minari id (`namespace/name-vN`) under MINARI_DATASETS_PATH."""
    if os.path.isdir(path_or_id) or os.path.isabs(path_or_id) or path_or_id.startswith("."):
        return os.path.abspath(path_or_id)
    from minari.storage.datasets_root_dir import get_dataset_path

    return os.path.abspath(str(get_dataset_path(path_or_id)))


def check_new_name(path: str) -> None:
    """A dataset to write must be named like Minari's ids (`name-vN`) and not exist yet."""
    name = os.path.basename(os.path.normpath(path))
    if not NAME.match(name):
        raise DatasetError(f"dataset {path}: its name must look like name-vN (Minari's dataset ids), e.g. "
                           f"{os.path.join(os.path.dirname(path), 'cartpole-expert-v0')}")
    if os.path.exists(os.path.join(path, "data", "metadata.json")):
        raise DatasetError(f"dataset {path} already exists")


@dataclass
class Episode:
    observations: np.ndarray  # (T + 1, ...)
    actions: np.ndarray       # (T, ...)
    rewards: np.ndarray       # (T,)
    terminations: np.ndarray  # (T,) bool
    truncations: np.ndarray   # (T,) bool
    seed: int | None = None


class DatasetWriter:
    """Appends episodes to a new (or, with `append`, an existing) Minari dataset at `path`."""

    def __init__(self, path: str, observation_space, action_space, metadata: dict, append: bool = False):
        from minari.dataset.minari_storage import MinariStorage

        self.path = os.path.abspath(path)
        data = os.path.join(self.path, "data")
        if append and os.path.isfile(os.path.join(data, "metadata.json")):
            self.storage = MinariStorage.read(data)
            return
        check_new_name(self.path)
        os.makedirs(data, exist_ok=True)
        self.storage = MinariStorage.new(data, observation_space=observation_space, action_space=action_space)
        import minari

        self.storage.update_metadata({"dataset_id": os.path.basename(self.path), "minari_version": minari.__version__,
                                      "algorithm_name": metadata.get("algo", "distrl"), "author": {"distrl"},
                                      "distrl": metadata})

    def add(self, episodes: list[Episode]) -> None:
        if not episodes:
            return
        from minari.data_collector import EpisodeBuffer

        self.storage.update_episodes([EpisodeBuffer(
            seed=ep.seed, observations=ep.observations, actions=ep.actions,
            rewards=np.asarray(ep.rewards, np.float64), terminations=np.asarray(ep.terminations, bool),
            truncations=np.asarray(ep.truncations, bool)) for ep in episodes])

    @property
    def total_episodes(self) -> int:
        return int(self.storage.total_episodes)


@dataclass
class Transitions:
    """A dataset flattened for replay: per step obs, action, reward, next obs (the true one), flags; obs and
    next_obs are trees of arrays (`distrl.tree`) for a Dict or Tuple observation."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_ends: np.ndarray  # index one past each episode's last step
    observation_space: object
    action_space: object
    metadata: dict


def read_dataset(path_or_id: str) -> Transitions:
    """Every step of a local Minari dataset, episode after episode; DatasetError naming what is wrong."""
    root = dataset_dir(path_or_id)
    data = os.path.join(root, "data")
    if not os.path.isfile(os.path.join(data, "metadata.json")):
        raise DatasetError(f"dataset {path_or_id}: no Minari dataset at {root} (expected {data}/metadata.json)")
    try:
        from minari import MinariDataset

        dataset = MinariDataset(data)
        cols: list[list[np.ndarray]] = [[] for _ in range(6)]
        ends = []
        for ep in dataset.iterate_episodes():
            o = tree.as_arrays(_tree(ep.observations))  # Minari gives a Dict's observations as a dict of arrays
            if tree.rows(o) != len(ep.actions) + 1:
                raise DatasetError(f"dataset {path_or_id}: episode {ep.id} holds {tree.rows(o)} observations for "
                                   f"{len(ep.actions)} actions (expected one more: the final observation)")
            before, after = tree.index(o, slice(None, -1)), tree.index(o, slice(1, None))
            for c, x in zip(cols, (before, ep.actions, ep.rewards, after, ep.terminations, ep.truncations)):
                c.append(tree.as_arrays(x))
            ends.append(sum(len(a) for a in cols[1]))
    except DatasetError:
        raise
    except Exception as e:  # noqa: BLE001 - a corrupt or foreign file: the user's input
        raise DatasetError(f"dataset {path_or_id} cannot be read: {' '.join(str(e).split())[:200]}") from None
    if not ends:
        raise DatasetError(f"dataset {path_or_id} holds no episodes")
    obs, actions, rewards, next_obs, term, trunc = (tree.concatenate(c) for c in cols)
    return Transitions(obs, actions, rewards.astype(np.float32), next_obs, term.astype(bool), trunc.astype(bool),
                       np.asarray(ends, np.int64), dataset.observation_space, dataset.action_space,
                       dict(dataset.storage.metadata))


def _tree(observations):
    """Minari's observations of an episode as distrl's tree: a Tuple's come as a tuple (or list) of leaves."""
    if isinstance(observations, dict):
        return {k: _tree(v) for k, v in observations.items()}
    if isinstance(observations, (tuple, list)):
        return tuple(_tree(v) for v in observations)
    return observations


def space_mismatch(dataset_space, env_space, what: str) -> str | None:
    """Why a dataset's space does not fit the env's, or None (a Dict or Tuple space: equal leaf by leaf)."""
    if tree.is_structured(dataset_space) or tree.is_structured(env_space):
        same = dataset_space == env_space
        return None if same else f"its {what} space {dataset_space} does not match the env's {env_space}"
    same = (type(dataset_space) is type(env_space) and getattr(dataset_space, "shape", None) == env_space.shape
            and getattr(dataset_space, "n", None) == getattr(env_space, "n", None))
    if same and hasattr(env_space, "low"):
        same = np.allclose(dataset_space.low, env_space.low) and np.allclose(dataset_space.high, env_space.high)
    return None if same else f"its {what} space {dataset_space} does not match the env's {env_space}"


def dataset_info(path_or_id: str) -> tuple[object, object, int]:
    """(observation space, action space, total steps) of a local dataset, from its metadata only."""
    data = os.path.join(dataset_dir(path_or_id), "data")
    if not os.path.isfile(os.path.join(data, "metadata.json")):
        raise DatasetError(f"dataset {path_or_id}: no Minari dataset at {os.path.dirname(data)} "
                           f"(expected {data}/metadata.json)")
    try:
        from minari.dataset.minari_storage import MinariStorage

        storage = MinariStorage.read(data)
        return storage.observation_space, storage.action_space, int(storage.total_steps)
    except Exception as e:  # noqa: BLE001 - a corrupt or foreign file: the user's input
        raise DatasetError(f"dataset {path_or_id} cannot be read: {' '.join(str(e).split())[:200]}") from None
