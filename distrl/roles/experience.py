"""The replay server's job without its process: the store, what a checkpoint takes from it, a refill."""
from __future__ import annotations

import numpy as np

from distrl.checkpoint import CheckpointError
from distrl.observe.trace import tracer
from distrl.replay.store import Block, Store, Take, digest, next_block


class ExperienceServer:
    """Holds a run's experience store (prioritized/uniform replay, or the on-policy FIFO) and hands the
    learner what `take` says per request."""

    def __init__(self, store: Store, take: Take):
        self.store, self.take = store, take

    def __len__(self) -> int:
        return len(self.store)

    @property
    def bytes_per_item(self) -> float | None:
        """Real bytes the replay holds per stored item (per stored step for sequence replay; frames counted
        once where observations stack them); None for the on-policy FIFO."""
        value = getattr(self.store, "bytes_per_item", None)
        return None if value is None else float(value)

    def add(self, data: dict[str, np.ndarray], priorities: np.ndarray | None, fragment_id: int = 0) -> None:
        with tracer().span("replay_add", "replay"):
            tracer().flow_in("fragment", fragment_id)
            self.store.add(data, priorities)

    def next_block(self, max_updates: int) -> Block | None:
        with tracer().span("sample_batch", "replay"):
            return next_block(self.store, self.take, max_updates)

    def update_priorities(self, indices, priorities, generations) -> None:
        with tracer().span("update_priorities", "replay"):
            self.store.update_priorities(indices, priorities, generations)

    def digest(self) -> str | None:
        return digest(self.store.state_dict())

    def state(self, max_bytes: int) -> dict | None:
        """The store's contents for a checkpoint, or None when larger than `max_bytes`
        (a resumed run then refills it from the workers)."""
        return self.store.state_dict() if self.store.checkpoint_nbytes <= max_bytes else None

    def write(self, directory: str, max_bytes: int) -> tuple[dict | None, dict]:
        """Write the contents into a checkpoint directory being built: (skeleton or None, meta).

        Writing where the store lives keeps a big replay out of any copy through another process.
        """
        return write_store(directory, self.state(max_bytes))

    def load(self, state: dict) -> None:
        self.store.load_state_dict(state)


def newest_store(run_dir: str) -> dict | None:
    """The store of the run's newest verified checkpoint; None when there is none yet or it left the store
    out (the workers then refill it)."""
    from distrl.checkpoint.run import load_latest

    try:
        _, state = load_latest(run_dir)
    except CheckpointError:
        return None
    return state["store"]


def write_store(directory: str, state: dict | None) -> tuple[dict | None, dict]:
    """A store state into a checkpoint being built: (skeleton or None, what the checkpoint's meta records)."""
    from distrl.checkpoint.store_file import save_store

    if state is None:
        return None, {"store_sha256": None, "store_saved": False}
    return save_store(directory, state), {"store_sha256": digest(state), "store_saved": True}
