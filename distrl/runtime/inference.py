"""Central inference as a Ray actor: the InferenceServer, hosting `distrl.roles.inference`. Its worker
side is `distrl.runtime.actors.RemoteInference`, which a worker's policy calls instead of its own network."""
from __future__ import annotations

import asyncio
import os

import ray
from ray.exceptions import RayTaskError

from distrl.config import from_dict
from distrl.observe.trace import tracer
from distrl.roles.factory import trace_settings
from distrl.runtime.actors import Traced, start_tracing
from distrl.runtime.ray_setup import ACTOR_GONE


@ray.remote(num_cpus=0, enable_task_events=False)
class InferenceServer(Traced):
    """Runs the workers' network for all of them (`distrl.roles.inference`); pulls the newest weights
    from the parameter server when a worker starts a fragment. An async actor: requests wait for
    their batch on one event loop."""

    def __init__(self, cfg_dict: dict, ps, num_workers: int):
        from distrl.roles.factory import acting_policy
        from distrl.roles.inference import InferenceBatcher

        cfg = from_dict(cfg_dict)
        start_tracing(trace_settings(cfg), "inference")
        self.policy = acting_policy(cfg, -1, num_workers)  # its forward only: workers explore themselves
        self.batcher = InferenceBatcher(self.policy, num_workers, cfg.rollout.batch_timeout_ms / 1000.0)
        self.ps = ps
        self.pulling = None  # the pull in flight: concurrent refreshes share it

    async def refresh(self) -> int:
        """Load newer weights if the parameter server has them; the version now held."""
        if self.pulling is None:
            self.pulling = asyncio.ensure_future(self._pull())
        pulling = self.pulling
        try:
            await pulling
        finally:
            if self.pulling is pulling:
                self.pulling = None
        return self.policy.version

    async def _pull(self) -> None:
        """A parameter server that is down (being restarted) costs this pull, not the workers' steps."""
        try:
            got = await self.ps.pull_if_changed.remote(self.policy.version)
            if got is None:
                return
            version, weights = got
        except (*ACTOR_GONE, RayTaskError):
            return
        with tracer().span("pull_weights", "transfer", version=version):
            tracer().flow_in("weights", version)
            self.policy.set_weights(weights, version)

    async def _have_weights(self) -> None:
        """A fresh or restarted server pulls before it answers (the learner published before any worker acted)."""
        while self.policy.version < 0:
            if await self.refresh() < 0:
                await asyncio.sleep(0.01)

    async def step(self, worker: int, obs, reset):
        """(outputs, weight version) for one step of `worker`'s envs."""
        await self._have_weights()
        return await self.batcher.step(worker, obs, reset), self.policy.version

    async def forward(self, obs, state):
        """`Policy.forward` on rows outside the envs' flow (a worker's bootstrap values)."""
        await self._have_weights()
        return self.policy.forward(obs, state)

    async def stats(self) -> dict:
        return {"batches": self.batcher.batches, "requests": self.batcher.requests}

    def pid(self) -> int:
        return os.getpid()
