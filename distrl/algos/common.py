"""Small helpers shared by algorithm files (no ray, no env code).

Importing this module does not import torch: the acting halves use its numpy
helpers in processes that never load torch. The torch helpers import it when called.
"""
from __future__ import annotations

import copy
import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from distrl.core import Algorithm, Batch, Trajectory, Weights
from distrl.replay import nstep_transitions

if TYPE_CHECKING:
    import torch
    from torch import nn

HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)  # log of the standard normal density's normaliser


class BoxScaler:
    """[-1, 1]^d <-> the env's Box bounds (computed in float64, clipped against rounding)."""

    def __init__(self, space):
        self.low = np.asarray(space.low, np.float64).reshape(-1)
        self.high = np.asarray(space.high, np.float64).reshape(-1)
        self.half = (self.high - self.low) / 2.0
        self.shape, self.dtype = tuple(space.shape), space.dtype

    def to_env(self, a: np.ndarray) -> np.ndarray:
        env_a = np.clip(self.low + (a + 1.0) * self.half, self.low, self.high)
        return env_a.astype(self.dtype, copy=False).reshape(len(a), *self.shape)

    def to_unit(self, env_a: np.ndarray) -> np.ndarray:
        a = (np.asarray(env_a, np.float64).reshape(len(env_a), -1) - self.low) / self.half - 1.0
        return np.clip(a, -1.0, 1.0).astype(np.float32)


def spec_problem(name: str, spec, discrete: bool, box: bool) -> str | None:
    """Why algorithm `name` can't run on `spec` (action kinds it takes; flat Box obs), or None."""
    from gymnasium import spaces

    act, obs = spec.action_space, spec.observation_space
    kinds = " or ".join(k for k, ok in (("Discrete", discrete), ("Box", box)) if ok)
    if isinstance(act, spaces.Box) and box:
        low, high = np.asarray(act.low, np.float64), np.asarray(act.high, np.float64)
        if len(act.shape) != 1 or not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low < high)):
            return f"{name} needs a flat Box action space with finite low < high, the env has {act}"
    elif not (isinstance(act, spaces.Discrete) and discrete):
        return f"{name} needs a {kinds} action space, the env has {act}"
    if not isinstance(obs, spaces.Box) or len(obs.shape) != 1:
        return f"{name} needs a flat Box observation space, the env has {obs}"
    return None


class ReplayAlgorithm(Algorithm):
    """An off-policy algorithm: its policy and learner are built from the config section `cfg.<name>`."""

    learner_cls: type
    discrete = False  # action spaces it takes
    box = False

    @classmethod
    def check_spec(cls, spec) -> str | None:
        return spec_problem(cls.name, spec, discrete=cls.discrete, box=cls.box)

    def make_learner(self, device: str):
        import torch

        torch.manual_seed(self.cfg.seed)
        return self.learner_cls(self.spec, getattr(self.cfg, self.name), device)


class TargetNetworkState:
    """The step, weights, checkpoint state and restore of a Q-learner holding `q`, `target`, `opt`, `updates`
    and a config with `grad_clip` and `target_update_interval`."""

    def init_networks(self, build, device: str) -> None:
        """Online and target networks from `build()` (the target a frozen copy), Adam on the online one."""
        self.q = build().to(device)
        self.target = build().to(device)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self.opt = adam(self.q.parameters(), self.cfg.lr, device)
        self.updates = 0

    def optimize(self, loss) -> float | None:
        """One guarded optimizer step on `loss` (see `guarded_step`), then the periodic hard target copy;
        the grad norm, or None when the loss or gradient was not finite and nothing changed."""
        norm = guarded_step(self.opt, self.q.parameters(), loss, self.cfg.grad_clip)
        if norm is None:
            return None
        self.updates += 1
        if self.updates % self.cfg.target_update_interval == 0:
            self.target.load_state_dict(self.q.state_dict())
        return norm

    def get_weights(self) -> Weights:
        return to_numpy_weights(self.q)

    def state_dict(self) -> dict:
        # Deep copy: torch hands out live tensors, which a checkpoint must not alias.
        return copy.deepcopy({"q": self.q.state_dict(), "target": self.target.state_dict(),
                              "opt": self.opt.state_dict(), "updates": self.updates})

    def load_state_dict(self, state: dict) -> None:
        self.q.load_state_dict(state["q"])
        self.target.load_state_dict(state["target"])
        self.opt.load_state_dict(state["opt"])
        self.updates = int(state["updates"])


class SequenceAlgorithm(ReplayAlgorithm):
    """A recurrent off-policy algorithm: its learner also takes the sequence layout (`cfg.sequence`)."""

    def make_learner(self, device: str):
        import torch

        torch.manual_seed(self.cfg.seed)
        return self.learner_cls(self.spec, getattr(self.cfg, self.name), self.cfg.sequence, device)


class SequenceQLearner(TargetNetworkState):
    """A Q-learner on time-major sequences of burn_in + length + n_step steps (R2D2, DHC): the steps
    it unrolls without gradient, trains on, and bootstraps from. Subclasses name `build_network(spec, cfg)`
    and `priorities(abs_td, live, eta)`, each item's new priority from its trained entries."""

    def __init__(self, spec, cfg, seq, device: str):
        self.cfg, self.device = cfg, device
        self.burn_in, self.length = int(seq.burn_in), int(seq.length)
        self.seq_len = self.burn_in + self.length + int(cfg.n_step)
        self.init_networks(lambda: self.build_network(spec, cfg), device)

    def check_steps(self, steps: int) -> None:
        """Refuse sequences cut for another layout (a policy and learner built from different configs)."""
        if steps != self.seq_len:
            raise ValueError(f"sequences of {steps} steps, the learner expects burn_in + length + "
                             f"n_step = {self.seq_len}: the policy and learner disagree on cfg.sequence")

    def step_and_report(self, loss, td, q_taken, live) -> dict:
        """One guarded step on `loss`, then the update's stats; `td`, `q_taken` and `live` (1 on the
        trained entries, 0 elsewhere) are tensors of one shape, the means are over the trained entries."""
        grad_norm = self.optimize(loss)
        if grad_norm is None:  # a non-finite loss or gradient: no step, and no priorities from it
            return skipped(loss)
        live, abs_td = live.cpu().numpy(), td.abs().cpu().numpy()
        real = max(float(live.sum()), 1.0)
        return {
            "loss": loss.item(),
            "q_mean": float((q_taken.cpu().numpy() * live).sum() / real),
            "td_abs_mean": float((abs_td * live).sum() / real),
            "grad_norm": grad_norm,
            "priorities": self.priorities(abs_td, live, self.cfg.priority_eta),
        }


def guarded_step(opt, params, loss=None, clip: float | None = None) -> float | None:
    """Backward `loss` (or use the gradients already set), clip to `clip`, step: the gradient norm.

    A non-finite loss or gradient would poison every weight it reaches, and through published
    weights every worker: then no step is taken, the gradients are cleared, and None is returned.
    """
    import torch

    params = list(params)
    if loss is not None:
        opt.zero_grad(set_to_none=True)
        if not bool(torch.isfinite(loss)):
            return None
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, clip if clip else math.inf, foreach=True)
    if not bool(torch.isfinite(norm)):
        opt.zero_grad(set_to_none=True)
        return None
    opt.step()
    return float(norm)


def skipped(loss) -> dict:
    """What an update that took no step returns (its loss or gradient was not finite)."""
    return {"nonfinite": 1, "loss": float(loss.detach()) if hasattr(loss, "detach") else float(loss)}


def mlp(sizes: list[int], activation=None, last_activation: bool = True) -> nn.Sequential:
    """Linear layers with `activation` (a module class, default ReLU) between them and, optionally, after."""
    from torch import nn

    activation = activation or nn.ReLU
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(activation())
    return nn.Sequential(*layers)


def to_numpy_weights(module: nn.Module) -> Weights:
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def numpy_linear(weights: Weights, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(W^T, b) of the Linear layer `name`, ready for `x @ W^T + b` in float32."""
    return (np.ascontiguousarray(np.asarray(weights[f"{name}.weight"], np.float32).T),
            np.asarray(weights[f"{name}.bias"], np.float32))


def numpy_sequential(weights: Weights, prefix: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W^T, b) of every Linear in the nn.Sequential `prefix` (from `mlp`), in order."""
    indices = sorted({int(k.split(".")[1]) for k in weights if k.startswith(prefix + ".")})
    return [numpy_linear(weights, f"{prefix}.{i}") for i in indices]


def nstep_items(traj: Trajectory, gamma: float, n_step: int) -> Batch:
    """A trajectory's n-step transitions as replay stores them (float32 observations)."""
    items = nstep_transitions(traj.obs, traj.actions, traj.rewards, traj.terminated,
                              traj.truncated, traj.next_obs, gamma, n_step)
    items.pop("nsteps", None)
    items["obs"] = items["obs"].astype(np.float32, copy=False)
    items["next_obs"] = items["next_obs"].astype(np.float32, copy=False)
    return items


def numpy_relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def numpy_mlp(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray, activation) -> np.ndarray:
    """Apply `activation` after every layer: the torso of `mlp(..., last_activation=True)`."""
    for w, b in layers:
        x = activation(x @ w + b)
    return x


def load_numpy_weights(module: nn.Module, weights: Weights) -> None:
    import torch

    module.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})


def adam(params, lr: float, device: str) -> torch.optim.Adam:
    import torch

    # The fused kernel takes one launch for all parameters: small networks are launch-bound.
    return torch.optim.Adam(params, lr=lr, fused=device.startswith(("cpu", "cuda")))


def as_tensors(batch: dict[str, np.ndarray], device: str) -> dict[str, torch.Tensor]:
    """Zero-copy on CPU; ignores private keys (leading underscore)."""
    import torch

    return {k: torch.as_tensor(v, device=device) for k, v in batch.items() if not k.startswith("_")}


# Arrays that arrive through Ray's object store are read-only views; we only ever
# read from the tensors made from them, so torch's warning about that is noise.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
