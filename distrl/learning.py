"""The learner's inner loop on a block of batches, shared by every mode."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from distrl.core import Learner


@dataclass
class TrainStats:
    """What one block of updates reports to the driver."""

    updates: int = 0
    loss_sum: float = 0.0
    lags: list[float] = field(default_factory=list)
    learner_s: float = 0.0
    wait_s: float = 0.0
    version: int = 0

    def merge(self, other: "TrainStats") -> None:
        self.updates += other.updates
        self.loss_sum += other.loss_sum
        self.lags.extend(other.lags)
        self.learner_s += other.learner_s
        self.wait_s += other.wait_s
        self.version = max(self.version, other.version)


def learn_block(learner: Learner, batches: dict[str, np.ndarray], weights: np.ndarray,
                stats: TrainStats) -> np.ndarray | None:
    """Run one update per batch in a (K, B, ...) block; return (K, B) priorities if any.

    Policy lag of a batch = learner updates so far - mean version of its data,
    where a version is the learner's update count when those weights were published.
    """
    k = weights.shape[0]
    priorities = None
    for i in range(k):
        batch = {key: v[i] for key, v in batches.items()}
        batch["weights"] = weights[i]
        stats.lags.append(float(learner.updates - batch["version"].mean()))
        out = learner.update(batch)
        stats.updates += 1
        stats.loss_sum += float(out.get("loss", 0.0))
        if "priorities" in out:
            if priorities is None:
                priorities = np.empty(weights.shape, np.float64)
            priorities[i] = out["priorities"]
    return priorities
