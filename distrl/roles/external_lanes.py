"""A recurrent policy's external steps into (T, E) fragments: each column holds one episode's steps in order,
so the learner unrolls it from the state stored with it, as a rollout worker's column.

A fragment stores one state per column, the one before its first step, and the learner zeroes the state
after every end in a column (`distrl.algos.actor_critic.episode_starts`). So an episode's steps go into a
column of their own: its next steps after each other, with no cut between them (a chunk of steps is not an
end here). Where its column fills (every T = rollout.fragment_length steps), the episode goes on in a new
column, which stores its state before that step: the `state` each step records (the state its action was
taken from). A piece of steps that starts from zeros (an episode's first) may go on in a column another
episode ended in, the fullest waiting, so columns fill without padding; the learner's reset there gives it
the zeros it acted from. Any other piece starts a column (a client reconnected mid-episode sends its
episode's own state, which a reset would lose).

Memory stays bounded: an open episode holds at most one column of steps here (T rows) besides the chunk it
gathers (`Episodes`), and each episode that starts takes a waiting column if there is one, so those waiting
are never more than the episodes open at once, but for the episodes reconnected clients announced again
mid-way (each of those starts a column of its own).
"""
from __future__ import annotations

import numpy as np

from distrl import tree
from distrl.roles.external_steps import Assembler, Episode, put


class Column:
    """A column being filled: each field's T rows (allocated when first put) and how many are set."""

    def __init__(self):
        self.arrays: dict = {}
        self.filled = 0


class Lanes(Assembler):
    """Chunks of complete steps of a recurrent policy's episodes -> (T, E) fragments, one column per piece of
    an episode (see the module docstring). An episode's column is its `Episode.column`."""

    cuts = False  # an episode's next chunk goes on in its column: no chunk ends but its episode's last

    def __init__(self, policy, fragment_length: int, columns: int, worker_index: int):
        super().__init__(policy, fragment_length, columns, worker_index)
        self.waiting: list[Column] = []  # columns whose last step is an end: a starting episode goes on there
        self.full: list[Column] = []  # columns complete, not yet in a fragment

    def add(self, rows: dict[str, np.ndarray], owner: Episode) -> None:
        k, at = len(rows["rewards"]), 0
        while at < k:
            if owner.column is None:
                owner.column = self._column_for(rows["x/state"][at])
            column = owner.column
            take = min(k - at, self.T - column.filled)
            put(column.arrays, self.T, column.filled, rows, at, take)
            column.filled += take
            at += take
            if column.filled == self.T:
                owner.column = None
                self._complete(column)
        if owner.column is not None and (rows["terminated"][-1] or rows["truncated"][-1]):
            self.waiting.append(owner.column)  # the episode ended inside it
            owner.column = None

    def cut(self, owner) -> None:
        """`owner`'s connection closed with it open: its column's last step becomes a truncation (bootstrapped
        from the next observation it holds), and another episode goes on after it."""
        column, owner.column = owner.column, None
        if column is not None:
            column.arrays["truncated"][column.filled - 1] = True
            self.waiting.append(column)

    def _column_for(self, state: np.ndarray) -> Column:
        """The column a piece starting from `state` goes into: from zeros, the fullest waiting one."""
        if self.waiting and not state.any():
            fullest = max(range(len(self.waiting)), key=lambda i: self.waiting[i].filled)
            return self.waiting.pop(fullest)
        return Column()

    def _complete(self, column: Column) -> None:
        self.full.append(column)
        if len(self.full) == self.E:  # laid column after column, as `Assembler._emit` reads them
            columns, self.full = self.full, []
            self.arrays = {name: tree.concatenate([c.arrays[name] for c in columns]) for name in columns[0].arrays}
            self._emit()
