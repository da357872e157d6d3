"""Behaviour cloning: supervised learning of the dataset's actions from its observations.

Discrete actions: cross-entropy of the policy's logits against the dataset's action. Box actions: the
policy gives tanh(mean) in [-1, 1]^d (the env's bounds mapped linearly), trained by squared error
against the dataset's actions mapped the same way. A row-wise loss, so gradient workers can share a step.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.nn import functional as F

from distrl import tree
from distrl.algos.common import (BoxScaler, NetworkPolicy, adam, as_tensors, guarded_step, load_optimizer_state,
                                 step_report, stored_obs)
from distrl.algos.offline import OfflineAlgorithm, dataset_trajectory
from distrl.algos.sharding import ShardedLearner
from distrl.config.fields import f
from distrl.config.sections import ModelConfig
from distrl.core import Batch, Learner, Trajectory
from distrl.models import make_torso
from distrl.models.masking import apply_mask
from distrl.sampling import Categorical, Gaussian


@dataclass
class BCConfig:
    lr: float = f(1e-3, "Adam learning rate", lo=0.0, lo_open=True)
    grad_clip: float | None = f(None, "max global gradient norm (null = no clipping)", lo=0.0, lo_open=True)


class BCNetwork(nn.Module):
    """torso -> logits (Discrete; masked actions' at MASKED) or tanh(mean) (Box, in [-1, 1])."""

    def __init__(self, torso: nn.Module, out_dim: int, box: bool):
        super().__init__()
        self.torso, self.box = torso, box
        self.head = nn.Linear(torso.out_features, out_dim)

    def forward(self, obs) -> torch.Tensor:
        out = self.head(self.torso(obs))
        return torch.tanh(out) if self.box else apply_mask(out, tree.mask_of(obs))


class BCLearner(ShardedLearner, Learner):
    def __init__(self, algo: BC, device: str):
        self.cfg, self.device = algo.cfg, device
        self.net = algo.build_network().to(device)
        self.opt = adam(self.net.parameters(), self.cfg.lr, device)
        self.updates = 0

    def trained_module(self) -> nn.Module:
        return self.net

    def sample_loss(self, s: dict[str, torch.Tensor]):
        out = self.net(s["obs"])
        if self.net.box:
            loss = (out - s["actions"]).square().sum(-1).mean()
            return loss, {"action_mse": loss.detach()}, {}
        loss = F.cross_entropy(out, s["actions"].long())
        accuracy = (out.argmax(-1) == s["actions"].long()).float().mean()
        return loss, {"accuracy": accuracy.detach()}, {}

    def update(self, batch: Batch) -> dict[str, Any]:
        t = as_tensors(batch, self.device)
        step = lambda loss: guarded_step(self.opt, self.net.parameters(), loss, self.cfg.grad_clip)  # noqa: E731
        (norm, bad), loss, terms, _ = self.sharded_step({"obs": t["obs"], "actions": t["actions"]}, step)
        self.updates += 1
        return step_report(norm, bad, loss, **terms)

    def weight_tensors(self) -> dict:
        return self.net.state_dict()

    def state_dict(self) -> dict:
        return copy.deepcopy({"net": self.net.state_dict(), "opt": self.opt.state_dict(), "updates": self.updates})

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        load_optimizer_state(self.opt, state["opt"])
        self.updates = int(state["updates"])


class BCPolicy(NetworkPolicy):
    """The cloned policy: argmax (or a softmax sample when exploring), or the Box action it predicts."""

    def __init__(self, algo: BC, worker_index: int, num_workers: int, seed: int):
        super().__init__(algo, worker_index, num_workers, seed)
        box = isinstance(algo.spec.action_space, spaces.Box)
        self.scaler = BoxScaler(algo.spec.action_space) if box else None

    def forward(self, obs, state: None):
        return {"out": self.run("forward", obs)}, None

    def acting_outputs(self) -> tuple[str, ...]:
        return ("out",)

    def acting_rule(self):
        """Its greedy action as a rule (an exported file's): the argmax, or the Box action it predicts. (Its
        exploring samples are its own: BC's workers never feed a replay.)"""
        return Categorical() if self.scaler is None else Gaussian(self.scaler)

    def act(self, obs, explore: bool):
        out = self.infer(obs)["out"]
        if self.scaler is not None:
            return self.scaler.to_env(out), {}
        if not explore:
            return out.argmax(axis=-1), {}
        p = np.exp(out - out.max(axis=-1, keepdims=True))
        cdf = (p / p.sum(axis=-1, keepdims=True)).cumsum(axis=-1)
        return np.minimum((cdf < self.rng.random((len(cdf), 1))).sum(axis=-1), cdf.shape[-1] - 1), {}

    def postprocess(self, traj: Trajectory) -> tuple[Batch, None]:
        raise RuntimeError("bc learns from a dataset only: its policy never feeds a replay")


class BC(OfflineAlgorithm):
    name = "bc"
    config = BCConfig
    model_config = ModelConfig
    model_defaults = {"hidden": [64, 64]}
    actions = ("discrete", "box")
    structured_obs = True
    gradient_workers = True
    learner_cls, policy_cls = BCLearner, BCPolicy

    def build_network(self) -> BCNetwork:
        act = self.spec.action_space
        box = isinstance(act, spaces.Box)
        torso = make_torso(self.spec.observation_space, self.model, self.image_torso)
        return BCNetwork(torso, int(np.prod(act.shape)) if box else int(act.n), box)

    def dataset_items(self, steps) -> Batch:
        traj = dataset_trajectory(steps)
        actions = traj.actions[:, 0]
        if isinstance(self.spec.action_space, spaces.Box):
            actions = BoxScaler(self.spec.action_space).to_unit(actions)
        return {"obs": stored_obs(tree.index(traj.obs, (slice(None), 0))), "actions": actions}
