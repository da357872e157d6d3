"""The simulator server as a Ray actor: to the driver, one more rollout worker (`sample` returns a
fragment), hosting `distrl.roles.external_server`.

It pulls the newest weights from the parameter server, as a worker does. It is started on the driver's
node (simulators connect to the address the driver wrote), on a port fixed before it starts, so that Ray
restarts it listening where its simulators reconnect. Its health check answers on a thread of its own
(`Traced.pid`); a dead or hung server is restarted and counted like any role (`external_restarts`).
"""
from __future__ import annotations

import ray
from ray.exceptions import RayTaskError

from distrl.config import from_dict
from distrl.roles.factory import trace_settings
from distrl.runtime.actor_base import Traced, peer, role_actor, start_tracing
from distrl.runtime.ray_setup import ACTOR_GONE

WAIT_S = 1.0  # a `sample` call waits this long for a fragment, then returns none (and the counts)


@role_actor(num_cpus=0)
class ExternalServer(Traced):
    def __init__(self, cfg_dict: dict, worker_index: int, ps, token: str, port: int):
        from distrl.roles.external_server import SimulatorServer

        cfg = from_dict(cfg_dict)
        start_tracing(trace_settings(cfg.log), "external", worker_index)
        self.ps = peer(ps)
        self.server = SimulatorServer(cfg, token, port, self._pull, worker_index)

    def _pull(self, version: int):
        """Newer weights than `version` from the parameter server, or None (none, or it is being restarted)."""
        try:
            return ray.get(self.ps.pull_if_changed.remote(version), timeout=5.0)
        except (*ACTOR_GONE, RayTaskError, ray.exceptions.GetTimeoutError):
            return None

    @ray.method(num_returns=2)
    def sample(self, blocking_pull: bool):
        """(info, (data, priorities, fragment id)), or (info, None) when no fragment was ready in WAIT_S."""
        frag = self.server.take(WAIT_S)
        return frag.info, None if frag.data is None else (frag.data, frag.priorities, frag.info.fragment_id)

    def close(self) -> None:
        """A worker's `close` before the actor is killed: the server stops listening and ends its sessions, so
        its simulators see the connection closed rather than a dead peer."""
        self.server.close()

    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        """Nothing to restore: clients' exploration slots start afresh."""
