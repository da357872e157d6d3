"""Central inference as a Ray actor: the InferenceServer, hosting `distrl.roles.inference`, and its worker
side, `RemoteInference`, which a worker's policy calls instead of its own network.

A restarted server keeps every env's recurrent state: it starts with none, so the first step a worker
sends it comes back from a new process, and the worker gives it back the states its envs had (the server
recomputes them from the worker's previous step, whose input and state the worker kept) and takes the
step again. No episode is cut or restarted; the restart is counted in `inference_restarts`.
"""
from __future__ import annotations

import asyncio
import os

import numpy as np
import ray
from ray.exceptions import RayTaskError

from distrl.acting import EnvStates, Inference, rows_of
from distrl.config import from_dict
from distrl.observe.trace import tracer
from distrl.roles.factory import trace_settings
from distrl.runtime.actor_base import Traced, peer, role_actor, start_tracing
from distrl.runtime.ray_setup import ACTOR_GONE


@role_actor(num_cpus=0)
class InferenceServer(Traced):
    """Runs the workers' network for all of them (`distrl.roles.inference`); pulls the newest weights
    from the parameter server when a worker starts a fragment. An async actor: requests wait for
    their batch on one event loop."""

    def __init__(self, cfg_dict: dict, ps, num_workers: int, device: str = "cpu"):
        from distrl.roles.factory import acting_policy
        from distrl.roles.inference import InferenceBatcher

        cfg = from_dict(cfg_dict)
        start_tracing(trace_settings(cfg.log), "inference")
        self.policy = acting_policy(cfg, -1, num_workers)  # its forward only: workers explore themselves
        self.policy.place(device)
        self.batcher = InferenceBatcher(self.policy, num_workers, cfg.rollout.batch_timeout_ms / 1000.0)
        self.ps = peer(ps)
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
        """(outputs, weight version, this process's id) for one step of `worker`'s envs."""
        await self._have_weights()
        return await self.batcher.step(worker, obs, reset), self.policy.version, os.getpid()

    async def restore(self, worker: int, state) -> None:
        """`worker`'s envs' recurrent states, as they were before this process started."""
        self.batcher.flush()  # a step of its waiting now would run with the states it is about to lose
        states = EnvStates(self.policy)
        states.state = np.array(state)
        self.batcher.states[worker] = states

    async def forward(self, obs, state):
        """`Policy.forward` on rows outside the envs' flow (a worker's bootstrap values)."""
        await self._have_weights()
        return self.policy.forward(obs, state)

    async def stats(self) -> dict:
        return {"batches": self.batcher.batches, "requests": self.batcher.requests}


class RemoteInference(Inference):
    """A worker's policy reaching its network on the InferenceServer: one round trip per env step."""

    def __init__(self, server, worker_index: int, policy):
        self.server, self.worker, self.policy = server, worker_index, policy
        self.resets = None  # envs that start an episode before the next step (None: none)
        self.fresh = True   # a new process: every env starts one
        self.server_pid = None  # the server process that answered last
        self.last = None  # (observations, states before) of the last step, with a recurrent policy

    def step(self, obs):
        reset = np.ones(rows_of(obs), bool) if self.fresh else self.resets
        self.fresh, self.resets = False, None
        out, version, server = ray.get(self.server.step.remote(self.worker, obs, reset))
        for _ in range(3):  # restarted again while its states were given back: once more
            if self.server_pid in (None, server) or self.last is None:
                break
            self.server_pid = server
            out, version, server = self._restore(obs, reset)
        self.server_pid, self.policy.version = server, version
        self.last = (obs, out["state"]) if "state" in out else None
        return out

    def _restore(self, obs, reset):
        """A restarted server began these envs from zero states: give it the states they had after the last
        step (recomputed from that step's input and states), and take this step again."""
        prev_obs, prev_state = self.last
        _, after = ray.get(self.server.forward.remote(prev_obs, prev_state))
        ray.get(self.server.restore.remote(self.worker, after))
        return ray.get(self.server.step.remote(self.worker, obs, reset))

    def forward(self, obs, state):
        return ray.get(self.server.forward.remote(obs, state))

    def reset(self, done) -> None:
        done = np.asarray(done, bool)
        self.resets = done.copy() if self.resets is None or len(self.resets) != len(done) else self.resets | done

    def refresh(self, blocking: bool) -> None:
        """Have the server pull newer weights: before this fragment's first step (sync mode) or alongside it."""
        ref = self.server.refresh.remote()
        if blocking or self.policy.version < 0:
            with tracer().span("pull_weights", "transfer"):
                self.policy.version = ray.get(ref)
