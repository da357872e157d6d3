"""What Ape-X DQN, R2D2 and DHC share: their config keys, epsilon-greedy exploration, the dueling head,
and a learner holding an online and a target network."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from distrl import tree
from distrl.algos.capture import GraphedStep, capturable, static_shapes
from distrl.algos.common import adam, as_tensors, guarded_step, load_optimizer_state, step_report
from distrl.config.fields import f
from distrl.sampling import epsilon_greedy  # noqa: F401 - the Q-learning algorithms' name for it


@dataclass
class EpsilonGreedyConfig:
    """How the Q-learning algorithms' workers explore: Ape-X's fixed epsilon per worker when there are
    several, one decaying epsilon for a single worker."""

    eps: float = f(0.4, "Ape-X base epsilon: worker i uses eps^(1 + eps_alpha*i/(N-1))", lo=0.0, hi=1.0)
    eps_alpha: float = f(7.0, "Ape-X epsilon spread exponent", lo=0.0)
    eps_start: float = f(1.0, "single-worker epsilon at the start of its decay", lo=0.0, hi=1.0)
    eps_end: float = f(0.02, "single-worker epsilon after the decay", lo=0.0, hi=1.0)
    eps_decay_steps: int = f(5000, "worker env steps over which a single worker's epsilon decays", lo=1)


@dataclass
class QLearningConfig(EpsilonGreedyConfig):
    """The Q head, its n-step target, and how the learner steps; each algorithm's section extends it and
    keeps its own defaults by overriding a field."""

    dueling: bool = f(True, "dueling value/advantage head")
    double: bool = f(True, "double-DQN target (online argmax, target value)")
    n_step: int = f(3, "steps in the n-step return", lo=1)
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    lr: float = f(1e-3, "Adam learning rate", lo=0.0, lo_open=True)
    target_update_interval: int = f(100, "updates between target-network copies", lo=1)
    grad_clip: float | None = f(10.0, "max global gradient norm (null = no clipping)", lo=0.0, lo_open=True)


def worker_epsilon(cfg: EpsilonGreedyConfig, worker_index: int, num_workers: int, env_steps: int) -> float:
    """Ape-X's fixed per-worker epsilon, or a linear decay for a lone worker; 0 for the evaluator (-1)."""
    if worker_index < 0:
        return 0.0
    if num_workers == 1:
        frac = min(1.0, env_steps / cfg.eps_decay_steps)
        return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)
    return cfg.eps ** (1.0 + cfg.eps_alpha * worker_index / (num_workers - 1))


class DuelingHead(nn.Module):
    """Q = V + A - mean(A) (Wang et al., 2016) over features on the last axis; A alone if not dueling."""

    def __init__(self, in_features: int, num_actions: int, dueling: bool):
        super().__init__()
        self.advantage = nn.Linear(in_features, num_actions)
        self.value = nn.Linear(in_features, 1) if dueling else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        adv = self.advantage(h)
        if self.value is None:
            return adv
        return self.value(h) + adv - adv.mean(dim=-1, keepdim=True)


class TargetNetworkState:
    """The step, weights, checkpoint state and restore of a Q-learner holding `q`, `target`, `opt`, `updates`
    and a config with `lr`, `grad_clip` and `target_update_interval`. Its subclass's `device_step(t)` is
    an update's device work (`update` = that, then `count_update`); `capture_update` records it as a
    CUDA graph (`distrl.algos.capture`)."""

    graphed: GraphedStep | None = None

    def init_networks(self, build, device: str) -> None:
        """Online and target networks from `build()` (the target a frozen copy), Adam on the online one."""
        self.q = build().to(device)
        self.target = build().to(device)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self.opt = adam(self.q.parameters(), self.cfg.lr, device)
        self.updates = 0

    def device_step(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def capture_update(self) -> None:
        if capturable(self.device, True):
            static_shapes(self.q, self.target)
            self.graphed = GraphedStep(self.device_step, [self.q, self.target], self.opt)

    def run_step(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`device_step(t)`, replayed as a graph where one was recorded (not when gradient workers share it)."""
        if self.graphed is not None and getattr(self, "gradient_fn", None) is None:
            return self.graphed(t)
        return self.device_step(t)

    def optimize(self, loss) -> tuple[torch.Tensor, torch.Tensor]:
        """One guarded optimizer step on `loss` (see `guarded_step`): (grad norm, skipped)."""
        return guarded_step(self.opt, self.q.parameters(), loss, self.cfg.grad_clip)

    def count_update(self) -> None:
        """Count an update, and copy the online weights to the target every target_update_interval. A skipped
        step is counted until its block is read back (`Learner.uncount`); a target copy it brings copies
        the unchanged weights."""
        self.updates += 1
        if self.updates % self.cfg.target_update_interval == 0:
            self.target.load_state_dict(self.q.state_dict())

    def weight_tensors(self) -> dict:
        return self.q.state_dict()

    def state_dict(self) -> dict:
        # Deep copy: torch hands out live tensors, which a checkpoint must not alias.
        return copy.deepcopy({"q": self.q.state_dict(), "target": self.target.state_dict(),
                              "opt": self.opt.state_dict(), "updates": self.updates})

    def load_state_dict(self, state: dict) -> None:
        self.q.load_state_dict(state["q"])
        self.target.load_state_dict(state["target"])
        load_optimizer_state(self.opt, state["opt"])
        self.updates = int(state["updates"])
        if self.graphed is not None:  # the optimizer's state tensors are new ones: record again
            self.graphed.reset()


class SequenceQLearner(TargetNetworkState):
    """A Q-learner on time-major sequences of burn_in + length + n_step steps (R2D2, DHC): the steps
    it unrolls without gradient, trains on, and bootstraps from. Subclasses name `priorities(abs_td,
    live, eta)`, each item's new priority from its trained entries."""

    def __init__(self, algo, device: str):
        self.cfg, self.device = algo.cfg, device
        self.burn_in, self.length = int(algo.sequence.burn_in), int(algo.sequence.length)
        self.seq_len = self.burn_in + self.length + int(self.cfg.n_step)
        self.init_networks(algo.build_network, device)

    def check_steps(self, steps: int) -> None:
        """Refuse sequences cut for another layout (a policy and learner built from different configs)."""
        if steps != self.seq_len:
            raise ValueError(f"sequences of {steps} steps, the learner expects burn_in + length + "
                             f"n_step = {self.seq_len}: the policy and learner disagree on cfg.sequence")

    def update(self, batch) -> dict:
        # A structured observation's leaves come as columns (`obs.image`, ...): its tree again.
        out = self.run_step(tree.from_columns(as_tensors(batch, self.device)))
        self.count_update()
        return out

    def device_step(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.step_and_report(*self.loss_and_td(t))

    def step_and_report(self, loss, td, q_taken, live) -> dict:
        """One guarded step on `loss`, then the update's stats as tensors; `td`, `q_taken` and `live` (1 on
        the trained entries, 0 elsewhere) are tensors of one shape, the means are over the trained entries."""
        norm, bad = self.optimize(loss)
        abs_td = td.abs()
        real = live.sum().clamp(min=1.0)
        return {**step_report(norm, bad, loss, q_mean=(q_taken * live).sum() / real,
                              td_abs_mean=(abs_td * live).sum() / real),
                "priorities": self.priorities(abs_td, live, self.cfg.priority_eta)}
