"""A3C (Mnih et al., 2016): workers compute A2C gradients, the learner applies them.

A worker's `postprocess` evaluates the A2C loss (see `distrl.algos.a2c`) of its
own fragment under its own copy of the published weights and sends a gradient
message instead of experience::

    {"grad/<param name>": float32 array shaped like the parameter, ...,
     "steps": [T*E], "version": [weights version],
     "loss_policy": [..], "loss_value": [..], "entropy": [..]}

The learner takes one message per update() (k = 1) in arrival order. A message
whose staleness (learner updates - version) exceeds max_staleness is dropped
without a step; otherwise its gradients become the master parameters' .grad,
are clipped to grad_clip and the optimizer steps once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from distrl.algos.a2c import a2c_loss
from distrl.algos.actor_critic import ActorCriticAlgorithm, ActorCriticLearner, GAEConfig, time_major
from distrl.algos.actor_critic_acting import ActorCriticPolicy
from distrl.config.fields import f
from distrl.core import Batch, Trajectory
from distrl.models import laid_out_as

_TERMS = ("loss_policy", "loss_value", "entropy")


@dataclass
class A3CConfig(GAEConfig):
    max_staleness: int = f(16, "gradients computed more than this many updates ago are dropped", lo=0)


class A3CPolicy(ActorCriticPolicy):
    """Acts like its parent; its network also computes its fragment's gradients (at the weights it acted with)."""

    def __init__(self, algo, worker_index: int, num_workers: int, seed: int):
        super().__init__(algo, worker_index, num_workers, seed)
        self.net.requires_grad_(True)
        self.recurrence = algo.recurrence

    def postprocess(self, traj: Trajectory) -> tuple[Batch, None]:
        items, _ = super().postprocess(traj)
        loss, terms = a2c_loss(self.net, time_major(items, "cpu"), self.cfg, self.recurrence)
        self.net.zero_grad(set_to_none=True)
        loss.backward()
        msg = {f"grad/{name}": (p.grad.numpy().astype(np.float32, copy=True) if p.grad is not None
                                else np.zeros(p.shape, np.float32))
               for name, p in self.net.named_parameters()}
        self.net.zero_grad(set_to_none=True)
        msg["steps"] = np.array([traj.rewards.size], np.int64)
        msg["version"] = np.array([self.version], np.int32)
        msg.update({k: np.array([v.item()], np.float32) for k, v in terms.items()})
        return msg, None


class A3CLearner(ActorCriticLearner):
    def __init__(self, algo, device: str):
        super().__init__(algo, device)
        self.params = dict(self.net.named_parameters())
        self.dropped = 0

    def update(self, batch: Batch) -> dict[str, Any]:
        if np.shape(batch["version"]) != (1,):
            raise ValueError("a3c takes exactly one gradient message per update (fragments_per_update = 1)")
        c = self.cfg
        staleness = self.updates - int(batch["version"][0])
        terms = {k: float(batch[k][0]) for k in _TERMS}
        loss = terms["loss_policy"] + c.vf_coef * terms["loss_value"] - c.ent_coef * terms["entropy"]
        out = {"loss": loss, **terms, "staleness": staleness}
        if "sequences_cut" in batch:  # a recurrent core's
            out["sequences_cut"] = float(batch["sequences_cut"][0])
        if staleness > c.max_staleness:
            self.dropped += 1
            return {**out, "dropped": 1, "dropped_total": self.dropped}
        for name, p in self.params.items():
            p.grad = laid_out_as(p, batch[f"grad/{name}"])  # a copy: the message may be a read-only view
        norm, bad = self.step()
        if not self.counted(bad):  # a worker sent a non-finite gradient
            return {**out, "nonfinite": 1, "staleness": staleness}
        self.updates += 1
        return {**out, "dropped": 0, "dropped_total": self.dropped, "grad_norm": float(norm),
                "staleness_applied": staleness, "optimizer_steps": self.optimizer_steps}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "dropped": self.dropped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.dropped = int(state.get("dropped", 0))


class A3C(ActorCriticAlgorithm):
    name = "a3c"
    config = A3CConfig
    modes = ("single", "async")
    data_path = "gradients"
    central_inference = False  # its workers compute gradients with their own copy: they act with it too
    learner_cls, policy_cls = A3CLearner, A3CPolicy
