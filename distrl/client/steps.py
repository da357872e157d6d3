"""Local inference's steps not yet sent, held per acting call (numpy only)."""
from __future__ import annotations

import numpy as np


class StepBuffer:
    """Local inference's steps not yet sent, kept as the blocks the acting calls made (each row: obs, action,
    extras, weights version, reward, and its episode's slot), so bookkeeping is per call, not per row. An
    experience message takes every episode's rows in order but for the newest of an open episode (its
    reward may still grow), grouped by one stable sort."""

    def __init__(self):
        self.blocks: list[dict[str, np.ndarray]] = []
        self.rows = 0
        self.nbytes = 0  # what the held rows' arrays take

    def add(self, slots: np.ndarray, obs: dict[str, np.ndarray], actions: np.ndarray, extras: dict[str, np.ndarray],
            version: int, rewards: np.ndarray) -> int:
        """One acting call's rows (`obs`: the observations' leaves by name, `distrl.client.spaces`); returns the
        block's index (its row i is `(index, i)`). A leaf is column `o/<name>`, an extra `x/<name>`."""
        self.blocks.append({"slots": slots, "actions": actions, "rewards": rewards,
                            "versions": np.full(len(slots), version, np.int64),
                            **{"o/" + k: v for k, v in obs.items()}, **{"x/" + k: v for k, v in extras.items()}})
        self.rows += len(slots)
        self.nbytes += sum(v.nbytes for v in self.blocks[-1].values())
        return len(self.blocks) - 1

    def add_reward(self, row: tuple[int, int], reward: float) -> None:
        self.blocks[row[0]]["rewards"][row[1]] += reward

    def split(self, held: list[tuple[int, int]]) -> tuple[dict[str, np.ndarray], np.ndarray, dict[int, np.ndarray]]:
        """(every row's columns, the positions of the `held` rows in them, each slot's other rows in order)."""
        if not self.blocks:
            return {}, np.zeros(0, np.int64), {}
        columns = {k: np.concatenate([b[k] for b in self.blocks]) for k in self.blocks[0]}
        starts = np.cumsum([0] + [len(b["slots"]) for b in self.blocks])
        hold = np.array([starts[b] + i for b, i in held], np.int64)
        sendable = np.ones(len(columns["slots"]), bool)
        sendable[hold] = False
        rows = np.flatnonzero(sendable)
        rows = rows[np.argsort(columns["slots"][rows], kind="stable")]
        slots = columns["slots"][rows]
        groups = np.split(rows, np.flatnonzero(slots[1:] != slots[:-1]) + 1) if len(rows) else []
        return columns, hold, {int(columns["slots"][g[0]]): g for g in groups}

    def keep(self, columns: dict[str, np.ndarray], hold: np.ndarray) -> None:
        """After a message went: only the held rows stay, as one block in the order they were held."""
        self.blocks = [{k: v[hold] for k, v in columns.items()}] if len(hold) else []
        self.rows = len(hold)
        self.nbytes = sum(v.nbytes for b in self.blocks for v in b.values())
