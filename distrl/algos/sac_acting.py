"""SAC's acting half: the squashed Gaussian actor in numpy, no torch (rollout workers never import it).

The learner, the networks and the losses are in `distrl.algos.sac`.
"""
from __future__ import annotations

import numpy as np

from distrl.algos.common import BoxScaler, nstep_items, numpy_linear, numpy_mlp, numpy_relu, numpy_sequential
from distrl.algos.squashed_gaussian import log_std_from_tanh
from distrl.core import Batch, EnvSpec, Policy, Trajectory, Weights


def _numpy_actor(weights: Weights) -> dict:
    return {"torso": numpy_sequential(weights, "torso"), "head": numpy_linear(weights, "head")}


def spec_dims(spec: EnvSpec) -> tuple[int, int]:
    """(observation size, action size) of a flat Box-in, Box-out env."""
    return int(np.prod(spec.observation_space.shape)), int(np.prod(spec.action_space.shape))


# --- policy ---------------------------------------------------------------------
class SACPolicy(Policy):
    def __init__(self, spec: EnvSpec, cfg, worker_index: int, num_workers: int, seed: int):
        self.cfg = cfg
        self.act_dim = spec_dims(spec)[1]
        self.scaler = BoxScaler(spec.action_space)
        self.worker_index = worker_index
        self.random_steps = cfg.random_steps / max(1, num_workers) if worker_index >= 0 else 0
        self.rng = np.random.default_rng(seed)
        self.env_steps = 0
        self._np: dict | None = None  # set_weights comes before the first act (workers pull first)

    def set_weights(self, weights: Weights, version: int) -> None:
        self._np = _numpy_actor(weights)
        self.version = version

    def mean_log_std(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Actor.forward in numpy: for a few dozen rows cheaper than torch's per-op overhead."""
        if self._np is None:
            raise RuntimeError("SACPolicy has no weights yet: call set_weights first")
        h = numpy_mlp(self._np["torso"], np.asarray(obs, np.float32).reshape(len(obs), -1), numpy_relu)
        w, b = self._np["head"]
        mean, raw = np.split(h @ w + b, 2, axis=1)
        return mean, log_std_from_tanh(np.tanh(raw))

    def forward(self, obs: np.ndarray, state: None):
        mean, log_std = self.mean_log_std(obs)
        return {"mean": mean, "log_std": log_std}, None

    def observe_steps(self, env_steps: int) -> None:
        self.env_steps = env_steps

    def act(self, obs: np.ndarray, explore: bool):
        n = len(obs)
        if explore and self.env_steps < self.random_steps:
            a = self.rng.uniform(-1.0, 1.0, (n, self.act_dim))
        else:
            net = self.infer(obs)
            mean, log_std = net["mean"], net["log_std"]
            u = mean + np.exp(log_std) * self.rng.standard_normal(mean.shape) if explore else mean
            a = np.tanh(u)
        return self.scaler.to_env(a), {}

    def postprocess(self, traj: Trajectory) -> tuple[Batch, None]:
        items = nstep_items(traj, self.cfg.gamma, self.cfg.n_step)
        items["actions"] = self.scaler.to_unit(items["actions"])
        return items, None
