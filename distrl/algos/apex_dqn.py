"""Ape-X DQN: double DQN with a dueling head, n-step returns and prioritized replay.

Workers act epsilon-greedily with per-worker epsilons (Horgan et al., 2018:
eps_i = eps ** (1 + alpha * i / (N - 1))) and compute each transition's
initial priority |TD error| from their own Q-values; the learner trains on
importance-weighted Huber loss and returns fresh priorities.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from distrl import tree
from distrl.algos.common import (NetworkAlgorithm, NetworkPolicy, as_tensors, nstep_items, obs_columns, step_report,
                                 stored_obs)
from distrl.algos.qlearning import DuelingHead, QLearningConfig, TargetNetworkState, worker_epsilon
from distrl.algos.sharding import ShardedLearner
from distrl.config.fields import f
from distrl.config.sections import ModelConfig
from distrl.core import Batch, Learner, Trajectory
from distrl.models import make_torso
from distrl.models.masking import apply_mask
from distrl.replay.frames import FrameEncoder, frame_stacks, frame_transitions
from distrl.sampling import EpsilonGreedy


@dataclass
class ApexDQNConfig(QLearningConfig):
    lr: float = f(2e-3, "Adam learning rate", lo=0.0, lo_open=True)


class QNetwork(nn.Module):
    """torso -> dueling Q head."""

    def __init__(self, torso: nn.Module, num_actions: int, dueling: bool):
        super().__init__()
        self.torso = torso
        self.head = DuelingHead(torso.out_features, num_actions, dueling)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(obs, .), masked actions' values MASKED where the observation has an action mask: argmax and
        max (acting, double-DQN targets over the next state's legal actions) never pick one."""
        return apply_mask(self.head(self.torso(obs)), tree.mask_of(obs))


class DQNLearner(TargetNetworkState, ShardedLearner, Learner):
    def __init__(self, algo: ApexDQN, device: str):
        self.cfg, self.device = algo.cfg, device
        self.init_networks(algo.build_network, device)

    def trained_module(self) -> nn.Module:
        return self.q

    @torch.no_grad()
    def targets(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """r + discount * Q_target(s', a*), a* the online argmax (double DQN) or the target's."""
        q_next_target = self.target(t["next_obs"])
        if self.cfg.double:
            best = self.q(t["next_obs"]).argmax(dim=1, keepdim=True)
            q_next = q_next_target.gather(1, best).squeeze(1)
        else:
            q_next = q_next_target.max(dim=1).values
        return t["rewards"] + t["discounts"] * q_next

    def sample_loss(self, s: dict[str, torch.Tensor]):
        """Importance-weighted Huber loss of Q(s, a) against the fixed targets; per row the TD error."""
        q_taken = self.q(s["obs"]).gather(1, s["actions"].long().view(-1, 1)).squeeze(1)
        elementwise = F.huber_loss(q_taken, s["target"], reduction="none")
        weights = s.get("weights")
        loss = (elementwise * weights).mean() if weights is not None else elementwise.mean()
        return loss, {"q_mean": q_taken.detach().mean()}, {"td": (q_taken - s["target"]).detach()}

    def update(self, batch: Batch) -> dict[str, Any]:
        out = self.run_step(as_tensors(batch, self.device))
        self.count_update()
        return out

    def device_step(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        rows = {"obs": t["obs"], "actions": t["actions"], "target": self.targets(t)}
        if "weights" in t:
            rows["weights"] = t["weights"]
        (norm, bad), loss, terms, per_row = self.sharded_step(rows, self.optimize)
        return {**step_report(norm, bad, loss, **terms), "priorities": per_row["td"].abs()}


class DQNPolicy(NetworkPolicy):
    """Epsilon-greedy on the Q-network; n-step transitions with initial priorities from its own Q-values."""

    env_steps = 0
    _frames: dict[str, FrameEncoder] | None = None  # per observation column kept as frames; at the first postprocess

    @property
    def epsilon(self) -> float:
        return worker_epsilon(self.cfg, self.worker_index, self.num_workers, self.env_steps)

    def forward(self, obs: np.ndarray, state: None):
        return {"q": self.run("forward", obs)}, None

    def observe_steps(self, env_steps: int) -> None:
        self.env_steps = env_steps

    def acting_outputs(self) -> tuple[str, ...]:
        return ("q",)

    def acting_rule(self) -> EpsilonGreedy:
        return EpsilonGreedy(self.epsilon)

    def act(self, obs: np.ndarray, explore: bool):
        return self.acting_rule().act(self.infer(obs), self.rng, explore)

    def postprocess(self, traj: Trajectory) -> tuple[Batch, np.ndarray]:
        T, E = traj.rewards.shape
        if self._frames is None:
            self._frames = {c: FrameEncoder(k, seed=self.worker_index)
                            for c, k in frame_stacks(obs_columns(traj.obs), self.spec.frame_stack).items()}
        if self._frames:  # stacked frames and image leaves travel and are stored once; replay rebuilds the obs
            items, rows, boot = frame_transitions(
                self._frames, obs_columns(traj.obs), traj.actions, traj.rewards, traj.terminated, traj.truncated,
                obs_columns(traj.next_obs), self.cfg.gamma, self.cfg.n_step)
        else:
            (items, boot), rows = nstep_items(traj, self.cfg.gamma, self.cfg.n_step), np.arange(T * E)
        q_next = self._max_q_next(traj, boot)
        # Initial priority (Ape-X): |TD error| under this worker's own Q-values.
        q_taken = np.take_along_axis(traj.extras["q"].reshape(T * E, -1)[rows],
                                     items["actions"].reshape(-1, 1).astype(np.int64), axis=1)[:, 0]
        td = items["rewards"] + items["discounts"] * q_next - q_taken
        # A reward near float32's limit can overflow the n-step sum: such an item is still stored, at top priority.
        return items, np.nan_to_num(np.abs(td), nan=np.finfo(np.float32).max, posinf=np.finfo(np.float32).max)


    def _max_q_next(self, traj: Trajectory, boot: np.ndarray) -> np.ndarray:
        """max_a Q(next_obs) at the flat (T, E) steps `boot`. Where step t ended no episode, its next
        observation is step t+1's observation, whose Q-values acting already computed: the network runs
        only on the others (the fragment's last step, episode ends), not on every step a second time."""
        T, E = traj.rewards.shape
        ended = np.asarray(traj.terminated, bool) | np.asarray(traj.truncated, bool)
        q_max = np.empty(T * E, np.float32)
        q_max[:(T - 1) * E] = traj.extras["q"][1:].max(axis=-1).ravel()
        acted = np.zeros((T, E), bool)
        acted[:-1] = ~ended[:-1]
        need = np.unique(boot[~acted.ravel()[boot]])
        if need.size:
            next_obs = stored_obs(tree.index(tree.flatten_lead(traj.next_obs, 2), need))
            q_max[need] = self.evaluate(next_obs)[0]["q"].max(axis=1)
        return q_max[boot]


class ApexDQN(NetworkAlgorithm):
    name = "apex_dqn"
    external = True
    config = ApexDQNConfig
    model_config = ModelConfig
    model_defaults = {"hidden": [64, 64]}
    actions = ("discrete",)
    structured_obs = True
    data_path = "replay"
    gradient_workers = True
    learner_cls, policy_cls = DQNLearner, DQNPolicy

    def build_network(self) -> QNetwork:
        torso = make_torso(self.spec.observation_space, self.model, self.image_torso)
        return QNetwork(torso, int(self.spec.action_space.n), self.cfg.dueling)
