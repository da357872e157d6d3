"""Central inference without the process around it: every worker's observations through one `forward`.

Workers send one request per env step (their vector of observations, and which of their envs
started a new episode); the batcher holds requests until every worker has one waiting, or until
`timeout_s` after the first, then runs the policy's `forward` once over all their rows
(`distrl.core.batched_forward`). Each worker's envs keep their recurrent states here, so a
recurrent policy's state never travels. Exploration stays in the workers: the batcher returns
the network's outputs, and each worker acts on its own with its own RNG and schedule.
"""
from __future__ import annotations

import asyncio

import numpy as np

from distrl.acting import EnvStates, batched_forward, rows_of
from distrl.core import Policy
from distrl.observe.trace import tracer


class InferenceBatcher:
    """Dynamic batches of workers' requests (asyncio: one event loop serves every request)."""

    def __init__(self, policy: Policy, num_workers: int, timeout_s: float):
        self.policy = policy
        self.expected, self.timeout_s = max(1, num_workers), timeout_s
        self.states: dict[int, EnvStates] = {}
        self.pending: list[tuple[int, np.ndarray, np.ndarray | None, asyncio.Future]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.batches = self.requests = 0

    async def step(self, worker: int, obs: np.ndarray, reset: np.ndarray | None) -> dict[str, np.ndarray]:
        """`forward`'s outputs for `worker`'s envs, after resetting the states of the envs in `reset`."""
        loop = asyncio.get_running_loop()
        if any(w == worker for w, *_ in self.pending):
            self.flush()  # a worker's steps are in order: its earlier one goes first
        future = loop.create_future()
        self.pending.append((worker, obs, reset, future))
        if len(self.pending) >= self.expected:
            self.flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.timeout_s, self.flush)
        return await future

    def flush(self) -> None:
        """Run the waiting requests as one batch and answer each."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.pending = self.pending, []
        if not batch:
            return
        try:
            with tracer().span("infer_batch", "inference", requests=len(batch), rows=sum(rows_of(o) for _, o, _, _ in batch)):
                outputs = batched_forward(self.policy, [(self._states(w, reset), obs) for w, obs, reset, _ in batch])
        except Exception as e:  # every waiting worker hears it, not only the one whose request ran it
            for *_, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        self.batches, self.requests = self.batches + 1, self.requests + len(batch)
        for (*_, future), out in zip(batch, outputs):
            if not future.done():  # the caller may have gone (a cancelled request)
                future.set_result(out)

    def _states(self, worker: int, reset: np.ndarray | None) -> EnvStates:
        states = self.states.setdefault(worker, EnvStates(self.policy))
        if reset is not None:
            states.reset(reset)
        return states
