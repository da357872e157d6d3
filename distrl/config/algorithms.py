"""One config section per algorithm, holding only the keys that algorithm reads."""
from __future__ import annotations

from dataclasses import dataclass

from distrl.config.fields import f


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
    """What Ape-X DQN, R2D2 and DHC share: the Q head, its n-step target, and how the learner steps;
    each section adds its network's keys and keeps its own defaults by overriding a field."""

    dueling: bool = f(True, "dueling value/advantage head")
    double: bool = f(True, "double-DQN target (online argmax, target value)")
    n_step: int = f(3, "steps in the n-step return", lo=1)
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    lr: float = f(1e-3, "Adam learning rate", lo=0.0, lo_open=True)
    target_update_interval: int = f(100, "updates between target-network copies", lo=1)
    grad_clip: float | None = f(10.0, "max global gradient norm (null = no clipping)", lo=0.0, lo_open=True)


@dataclass
class ApexDQNConfig(QLearningConfig):
    hidden: list = f([64, 64], "hidden layer sizes of the Q-network torso", item_lo=1)
    lr: float = f(2e-3, "Adam learning rate", lo=0.0, lo_open=True)


@dataclass
class SACConfig:
    hidden: list = f([256, 256], "hidden layer sizes of actor and critics", item_lo=1)
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    n_step: int = f(1, "steps in the n-step critic target", lo=1)
    tau: float = f(0.005, "Polyak factor for the target critics", lo=0.0, hi=1.0, lo_open=True)
    actor_lr: float = f(3e-4, "actor Adam learning rate", lo=0.0, lo_open=True)
    critic_lr: float = f(3e-4, "critic Adam learning rate", lo=0.0, lo_open=True)
    alpha_lr: float = f(3e-4, "temperature Adam learning rate", lo=0.0, lo_open=True)
    init_alpha: float = f(1.0, "initial entropy temperature", lo=0.0, lo_open=True)
    autotune_alpha: bool = f(True, "learn the temperature towards target_entropy")
    target_entropy: float | None = f(None, "entropy target (null = -dim(action space))")
    random_steps: int = f(5000, "worker env steps with uniform random actions before the policy acts", lo=0)


@dataclass
class R2D2Config(QLearningConfig):
    hidden: list = f([64], "MLP torso layer sizes before the recurrent core", item_lo=1)
    core: str = f("lstm", "recurrent core: lstm | gru", choices=("lstm", "gru"))
    core_size: int = f(64, "recurrent state size", lo=1)
    value_rescaling: bool = f(True, "targets through h(x) = sign(x)(sqrt(|x|+1) - 1) + eps x and its inverse")
    rescale_eps: float = f(1e-3, "the eps of the value rescaling h", lo=0.0)
    priority_eta: float = f(0.9, "sequence priority: eta * max|td| + (1 - eta) * mean|td|", lo=0.0, hi=1.0)


@dataclass
class DHCConfig(QLearningConfig):
    encoder: list = f([32, 32], "conv channels over a field-of-view observation (3x3 kernels; [] = one linear layer over the flattened view), or MLP sizes for flat ones", item_lo=1, min_items=0)
    core_size: int = f(64, "GRU state size per agent", lo=1)
    comm: bool = f(True, "exchange messages between agents (off: independent parameter-shared agents)")
    comm_heads: int = f(2, "attention heads of the communication block", lo=1)
    comm_rounds: int = f(1, "rounds of communication per step", lo=1)
    priority_eta: float = f(0.9, "sequence priority: eta * max|td| + (1 - eta) * mean|td| over agents and steps", lo=0.0, hi=1.0)
    target_update_interval: int = f(200, "updates between target-network copies", lo=1)
    eps_decay_steps: int = f(20000, "worker env steps over which a single worker's epsilon decays", lo=1)


@dataclass
class ActorCriticConfig:
    """What A2C, A3C, PPO and IMPALA share; each has its own section with its own extra keys."""

    hidden: list = f([64, 64], "hidden layer sizes of the policy and value networks", item_lo=1)
    shared_torso: bool = f(False, "policy and value heads share one torso")
    gamma: float = f(0.99, "discount factor", lo=0.0, hi=1.0)
    lr: float = f(3e-4, "Adam learning rate", lo=0.0, lo_open=True)
    vf_coef: float = f(0.5, "value loss coefficient", lo=0.0)
    ent_coef: float = f(0.0, "entropy bonus coefficient", lo=0.0)
    grad_clip: float | None = f(0.5, "max global gradient norm (null = no clipping)", lo=0.0, lo_open=True)
    normalize_advantages: bool = f(True, "standardise advantages per update")


@dataclass
class A2CConfig(ActorCriticConfig):
    gae_lambda: float = f(0.95, "GAE lambda (1.0 = n-step returns)", lo=0.0, hi=1.0)


@dataclass
class A3CConfig(A2CConfig):
    max_staleness: int = f(16, "gradients computed more than this many updates ago are dropped", lo=0)


@dataclass
class PPOConfig(A2CConfig):
    clip: float = f(0.2, "surrogate ratio clip", lo=0.0, lo_open=True)
    vf_clip: float | None = f(None, "value clipping range (null = off)", lo=0.0, lo_open=True)
    epochs: int = f(4, "passes over each batch", lo=1)
    minibatches: int = f(4, "minibatches per epoch", lo=1)
    rho_bar: float = f(1.0, "async lag correction: V-trace importance weight clip", lo=0.0, lo_open=True)
    c_bar: float = f(1.0, "async lag correction: V-trace trace-cutting clip", lo=0.0, lo_open=True)


@dataclass
class ImpalaConfig(ActorCriticConfig):
    rho_bar: float = f(1.0, "V-trace importance weight clip for the value target and advantages", lo=0.0, lo_open=True)
    c_bar: float = f(1.0, "V-trace trace-cutting clip", lo=0.0, lo_open=True)
