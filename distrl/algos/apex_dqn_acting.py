"""Ape-X DQN's acting half: epsilon-greedy in numpy, no torch (rollout workers never import it).

The learner, its network and the loss are in `distrl.algos.apex_dqn`.
"""
from __future__ import annotations

import numpy as np

from distrl.algos.common import nstep_items, numpy_linear, numpy_mlp, numpy_relu, numpy_sequential
from distrl.core import Batch, EnvSpec, Policy, Trajectory, Weights


def worker_epsilon(cfg, worker_index: int, num_workers: int, env_steps: int) -> float:
    """Ape-X's fixed per-worker epsilon, or a linear decay for a lone worker."""
    if worker_index < 0:
        return 0.0
    if num_workers == 1:
        frac = min(1.0, env_steps / cfg.eps_decay_steps)
        return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)
    return cfg.eps ** (1.0 + cfg.eps_alpha * worker_index / (num_workers - 1))


def _numpy_layers(weights: Weights) -> dict:
    """(W^T, b) pairs of the torso's Linear layers and of the heads."""
    return {"torso": numpy_sequential(weights, "torso"), "adv": numpy_linear(weights, "advantage"),
            "value": numpy_linear(weights, "value") if "value.weight" in weights else None}


class DQNPolicy(Policy):
    def __init__(self, spec: EnvSpec, cfg, worker_index: int, num_workers: int, seed: int):
        self.cfg = cfg
        self.num_actions = int(spec.action_space.n)
        self.worker_index, self.num_workers = worker_index, num_workers
        self.rng = np.random.default_rng(seed)
        self.env_steps = 0
        self._np: dict | None = None  # set_weights comes before the first act (workers pull first)

    @property
    def epsilon(self) -> float:
        return worker_epsilon(self.cfg, self.worker_index, self.num_workers, self.env_steps)

    def set_weights(self, weights: Weights, version: int) -> None:
        self._np = _numpy_layers(weights)
        self.version = version

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """The Q-network in numpy: for a few dozen rows, cheaper than torch's per-op overhead."""
        if self._np is None:
            raise RuntimeError("DQNPolicy has no weights yet: call set_weights first")
        h = numpy_mlp(self._np["torso"], np.asarray(obs, np.float32), numpy_relu)
        adv = h @ self._np["adv"][0] + self._np["adv"][1]
        if self._np["value"] is None:
            return adv
        w, b = self._np["value"]
        return (h @ w + b) + adv - adv.mean(axis=1, keepdims=True)

    def forward(self, obs: np.ndarray, state: None):
        return {"q": self.q_values(obs)}, None

    def observe_steps(self, env_steps: int) -> None:
        self.env_steps = env_steps

    def act(self, obs: np.ndarray, explore: bool):
        q = self.infer(obs)["q"]
        actions = q.argmax(axis=1)
        if explore:
            random = self.rng.random(len(obs)) < self.epsilon
            actions = np.where(random, self.rng.integers(0, self.num_actions, len(obs)), actions)
        return actions, {"q": q}

    def postprocess(self, traj: Trajectory) -> tuple[Batch, np.ndarray]:
        items = nstep_items(traj, self.cfg.gamma, self.cfg.n_step)
        # Initial priority (Ape-X): |TD error| under this worker's own Q-values.
        q_taken = np.take_along_axis(traj.extras["q"].reshape(len(items["actions"]), -1),
                                     items["actions"].reshape(-1, 1).astype(np.int64), axis=1)[:, 0]
        q_next = self.evaluate(items["next_obs"])[0]["q"].max(axis=1)
        td = items["rewards"] + items["discounts"] * q_next - q_taken
        # A reward near float32's limit can overflow the n-step sum: such an item is still stored, at top priority.
        return items, np.nan_to_num(np.abs(td), nan=np.finfo(np.float32).max, posinf=np.finfo(np.float32).max)
