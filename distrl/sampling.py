"""How a policy picks actions from its network's outputs, in numpy: epsilon-greedy on Q-values, a
categorical on logits, a factored categorical (one categorical per factor of a MultiDiscrete or MultiBinary
action), a Gaussian, a tanh-squashed Gaussian.

Logits a network set very low (-1e9: an action masked out) give that action probability exactly zero: it is
never sampled, and log-probs stay finite.

The network runs elsewhere (torch, its numpy program, or an exported ONNX file); what is here turns its
outputs into actions with the actor's own RNG. Rollout workers and the evaluator act through these
rules, and so does a simulator acting with its own copy of the network (`distrl.client`, local
inference): a rule travels to it as plain data (`ActingRule.to_wire`, `rule_from_wire`). No torch here.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)  # log of the standard normal density's normaliser


class BoxScaler:
    """[-1, 1]^d <-> a Box's bounds (computed in float64, clipped against rounding). `space`: anything with
    the Box's `low`, `high`, `shape` and `dtype`."""

    def __init__(self, space):
        self.low = np.asarray(space.low, np.float64).reshape(-1)
        self.high = np.asarray(space.high, np.float64).reshape(-1)
        self.half = (self.high - self.low) / 2.0
        self.shape, self.dtype = tuple(space.shape), np.dtype(space.dtype)

    def to_env(self, a: np.ndarray) -> np.ndarray:
        env_a = np.clip(self.low + (a + 1.0) * self.half, self.low, self.high)
        return env_a.astype(self.dtype, copy=False).reshape(len(a), *self.shape)

    def to_unit(self, env_a: np.ndarray) -> np.ndarray:
        a = (np.asarray(env_a, np.float64).reshape(len(env_a), -1) - self.low) / self.half - 1.0
        return np.clip(a, -1.0, 1.0).astype(np.float32)

    def to_wire(self) -> dict:
        return {"low": self.low.tolist(), "high": self.high.tolist(), "shape": list(self.shape),
                "dtype": self.dtype.name}


class Factors:
    """A MultiDiscrete or MultiBinary action space as factors: each one's number of choices (`nvec`) and first
    value (`start`), flat in C order, and the env's action shape and dtype (a MultiBinary is 2 choices from 0
    per element)."""

    def __init__(self, nvec, start, shape, dtype):
        self.nvec = np.asarray(nvec, np.int64).reshape(-1)
        self.start = np.broadcast_to(np.asarray(start, np.int64).reshape(-1), self.nvec.shape).copy()
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        if not len(self.nvec) or (self.nvec < 1).any() or int(np.prod(self.shape)) != len(self.nvec):
            raise ValueError(f"factors need nvec >= 1, one per element of shape {self.shape}, got {self.nvec.tolist()}")
        if self.dtype.kind not in "iu":
            raise ValueError(f"factored actions are integers, not {self.dtype.name}")
        self.index = factor_index(self.nvec)

    def to_env(self, choices: np.ndarray) -> np.ndarray:
        """(B, F) choices from 0 -> (B, *shape) env actions in the env's dtype."""
        return (choices + self.start).astype(self.dtype, copy=False).reshape(len(choices), *self.shape)

    def to_wire(self) -> dict:
        return {"nvec": self.nvec.tolist(), "start": self.start.tolist(), "shape": list(self.shape),
                "dtype": self.dtype.name}


class Bounds:
    """A Box's bounds as plain data (what `BoxScaler.to_wire` wrote)."""

    def __init__(self, low, high, shape, dtype):
        self.low, self.high, self.shape, self.dtype = low, high, tuple(shape), dtype


MASKED = -1e9  # a masked action's logit or Q-value (`distrl.models.masking`)


def epsilon_greedy(q: np.ndarray, epsilon: float, rng: np.random.Generator | None) -> np.ndarray:
    """argmax over the last axis of `q`, each replaced with probability `epsilon` by a uniform action among
    the legal ones (those whose value is not MASKED; no RNG: greedy)."""
    actions = q.argmax(axis=-1)
    if rng is None or epsilon <= 0.0:
        return actions
    shape = actions.shape
    random = rng.random(shape) < epsilon
    legal = q > MASKED / 2
    if legal.all():
        return np.where(random, rng.integers(0, q.shape[-1], shape), actions)
    # The k-th legal action, k uniform below the row's count of them.
    k = np.floor(rng.random(shape) * legal.sum(axis=-1)).astype(np.int64)
    choice = ((np.cumsum(legal, axis=-1) == (k + 1)[..., None]) & legal).argmax(axis=-1)
    return np.where(random, choice, actions)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Log-probabilities over the last axis of `x`."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def choose(logp_all: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """An index over the last axis of `logp_all` per row: the argmax (no RNG), or sampled by inverse CDF with
    one uniform per row. A choice of probability zero is never sampled."""
    if rng is None:
        return logp_all.argmax(axis=-1)
    p = np.exp(logp_all)
    cdf = p.cumsum(axis=-1)
    u = rng.random((*cdf.shape[:-1], 1)) * cdf[..., -1:]
    a = (cdf <= u).sum(axis=-1)  # <=: a zero-probability choice's empty interval [cdf, cdf) holds no u
    # u * total rounded up to the total would pick past the last choice of positive probability.
    last = p.shape[-1] - 1 - (p[..., ::-1] > 0).argmax(axis=-1)
    return np.minimum(a, last)


def categorical_act(logits: np.ndarray, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
    """Sampled (rng given) or greedy actions and their log-probs."""
    logp_all = log_softmax(logits)
    a = choose(logp_all, rng)
    return a, logp_all[np.arange(len(a)), a].astype(np.float32)


def factor_index(nvec) -> np.ndarray:
    """(F, K) indices, K = max(nvec), into a row of sum(nvec) logits (factor after factor) followed by one
    padding logit: row f lists factor f's logits, then the padding index where it has fewer than K choices."""
    nvec = np.asarray(nvec, np.int64).reshape(-1)
    offsets = np.cumsum(nvec) - nvec
    j = np.arange(int(nvec.max()))
    return np.where(j < nvec[:, None], offsets[:, None] + j, int(nvec.sum()))


def factored_logp_all(logits: np.ndarray, index: np.ndarray) -> np.ndarray:
    """(B, F, K) per-factor log-probabilities from (B, sum(nvec)) logits (`index`: `factor_index(nvec)`);
    -inf for the padding past a factor's choices."""
    pad = np.full((len(logits), 1), -np.inf, logits.dtype)
    return log_softmax(np.concatenate([logits, pad], axis=1)[:, index])


def factored_act(logits: np.ndarray, index: np.ndarray, rng: np.random.Generator | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per factor a sample (rng given: one uniform per factor) or the argmax, as (B, F) choices counted from 0,
    and the log-probs of the whole actions (the sum over factors)."""
    logp_all = factored_logp_all(logits, index)
    a = choose(logp_all, rng)
    logp = np.take_along_axis(logp_all, a[..., None], axis=-1)[..., 0].sum(axis=-1)
    return a, logp.astype(np.float32)


def gaussian_act(mean: np.ndarray, log_std: np.ndarray, rng: np.random.Generator | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Sampled (rng given) or mean actions in the normalised space, and their log-probs."""
    noise = rng.standard_normal(mean.shape).astype(np.float32) if rng is not None else np.zeros_like(mean)
    a = mean + np.exp(log_std) * noise
    logp = -(0.5 * noise * noise + log_std + HALF_LOG_2PI).sum(axis=1)
    return a.astype(np.float32), logp.astype(np.float32)


class ActingRule:
    """Actions (for the env) and the extras a trajectory keeps, from a network's outputs for a batch of rows.
    `explore` False: the greedy action, as the evaluator takes it."""

    kind = ""

    def act(self, outputs: dict[str, np.ndarray], rng: np.random.Generator, explore: bool
            ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        raise NotImplementedError

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind}


class EpsilonGreedy(ActingRule):
    """Q-values ("q") -> argmax, or with probability `epsilon` a uniform action (exploring); extras: q."""

    kind = "epsilon_greedy"

    def __init__(self, epsilon: float):
        self.epsilon = float(epsilon)

    def act(self, outputs, rng, explore):
        q = outputs["q"]
        return epsilon_greedy(q, self.epsilon, rng if explore else None), {"q": q}

    def to_wire(self):
        return {"kind": self.kind, "epsilon": self.epsilon}


class Categorical(ActingRule):
    """Logits ("out") -> a sample (exploring) or the argmax; extras: logp and, where the network has
    one, the value."""

    kind = "categorical"

    def act(self, outputs, rng, explore):
        a, logp = categorical_act(outputs["out"], rng if explore else None)
        return a, {"logp": logp, **({"value": outputs["value"]} if "value" in outputs else {})}


class FactoredCategorical(ActingRule):
    """Logits ("out": sum(nvec), factor after factor) -> per factor a sample (exploring) or the argmax, as the
    env's action; extras: logp (of the whole action: the sum over factors) and, where the network has one,
    the value."""

    kind = "factored_categorical"

    def __init__(self, factors: Factors):
        self.factors = factors

    def act(self, outputs, rng, explore):
        a, logp = factored_act(outputs["out"], self.factors.index, rng if explore else None)
        return self.factors.to_env(a), {"logp": logp, **({"value": outputs["value"]} if "value" in outputs else {})}

    def to_wire(self):
        return {"kind": self.kind, "factors": self.factors.to_wire()}


class Gaussian(ActingRule):
    """A diagonal Gaussian (mean "out", "log_std") in [-1, 1]^d, mapped onto the Box; the mean when
    greedy. Extras: logp, the value where the network has one, and the unmapped sample (raw_action)."""

    kind = "gaussian"

    def __init__(self, box: BoxScaler):
        self.box = box

    def act(self, outputs, rng, explore):
        out = outputs["out"]
        log_std = outputs.get("log_std", np.zeros_like(out))
        a, logp = gaussian_act(out, log_std, rng if explore else None)
        extras = {"logp": logp, **({"value": outputs["value"]} if "value" in outputs else {}), "raw_action": a}
        return self.box.to_env(a), extras

    def to_wire(self):
        return {"kind": self.kind, "box": self.box.to_wire()}


class SquashedGaussian(ActingRule):
    """SAC's: tanh of a Gaussian sample ("mean", "log_std"), mapped onto the Box; tanh(mean) when greedy;
    uniform actions while `uniform` (its share of the random steps). No extras."""

    kind = "squashed_gaussian"

    def __init__(self, box: BoxScaler, uniform: bool = False):
        self.box, self.uniform = box, bool(uniform)

    def act(self, outputs, rng, explore):
        if explore and self.uniform:
            return self.box.to_env(rng.uniform(-1.0, 1.0, (len(outputs["mean"]), len(self.box.low)))), {}
        mean, log_std = outputs["mean"], outputs["log_std"]
        u = mean + np.exp(log_std) * rng.standard_normal(mean.shape) if explore else mean
        return self.box.to_env(np.tanh(u)), {}

    def to_wire(self):
        return {"kind": self.kind, "box": self.box.to_wire(), "uniform": self.uniform}


def rule_from_wire(d: dict[str, Any]) -> ActingRule:
    """The rule `ActingRule.to_wire` described; ValueError for one it did not write."""
    kind = d.get("kind") if isinstance(d, dict) else None
    try:
        if kind == "epsilon_greedy":
            return EpsilonGreedy(float(d["epsilon"]))
        if kind == "categorical":
            return Categorical()
        if kind == "factored_categorical":
            return FactoredCategorical(Factors(**d["factors"]))
        box = BoxScaler(Bounds(**d["box"])) if kind in ("gaussian", "squashed_gaussian") else None
        if kind == "gaussian":
            return Gaussian(box)
        if kind == "squashed_gaussian":
            return SquashedGaussian(box, bool(d.get("uniform", False)))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"acting rule {d!r}: {e}") from None
    raise ValueError(f"unknown acting rule {kind!r}")
