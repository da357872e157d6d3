"""One optimizer step whose gradient is computed on shards of the samples, possibly in other processes.

A learner that shards splits each step's samples (rows, after the whole-batch targets are computed)
into K shards. Each shard's gradient is taken at the learner's current weights by `shard_gradient`
(in a gradient worker, or in-process); the learner averages them weighted by shard rows, which is
exactly the gradient of the mean loss over all rows, and takes the one `optimizer.step()` itself.
With no `gradient_fn` set, the step is computed locally on all rows, as a single learner does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from distrl import tree
from distrl.models import laid_out_as, load_numpy_weights, to_numpy_weights
from distrl.core import Weights

Samples = dict[str, np.ndarray]


@dataclass
class ShardGradient:
    """What one shard gives back: its rows, the gradient of its mean loss per trainable parameter (in
    `parameters()` order), its loss and diagnostic terms, and per-row outputs (e.g. TD errors)."""

    rows: int
    grads: list[np.ndarray]
    loss: float
    terms: dict[str, float] = field(default_factory=dict)
    per_row: dict[str, np.ndarray] = field(default_factory=dict)


Step = tuple[torch.Tensor, torch.Tensor]
"""An optimizer step's (grad norm, skipped: its loss or gradient was not finite), as `guarded_step` gives them."""

GradientFn = Callable[[Weights, list[Samples]], list[ShardGradient]]
"""Computes the gradients of shards at the given weights (the runtime maps it onto gradient workers)."""


def split_rows(samples: Samples, k: int) -> list[Samples]:
    """`k` contiguous shards of nearly equal size (fewer when there are fewer rows than k)."""
    n = tree.rows(next(iter(samples.values())))
    bounds = np.linspace(0, n, min(k, n) + 1).round().astype(int)
    return [{key: tree.index(v, slice(a, b)) for key, v in samples.items()} for a, b in zip(bounds[:-1], bounds[1:])]


def shard_gradient(learner: "ShardedLearner", weights: Weights, shard: Samples) -> ShardGradient:
    """The job of a gradient worker: the gradient of `learner.sample_loss` on `shard` at `weights`."""
    module = learner.trained_module()
    load_numpy_weights(module, weights)
    t = {k: tree.map(lambda x: torch.as_tensor(x, device=learner.device), v) for k, v in shard.items()}
    loss, terms, per_row = learner.sample_loss(t)
    module.zero_grad(set_to_none=True)
    loss.backward()
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().numpy().copy()
             for p in module.parameters()]
    module.zero_grad(set_to_none=True)
    return ShardGradient(tree.rows(next(iter(shard.values()))), grads, float(loss.detach()),
                         {k: float(v.detach()) for k, v in terms.items()},
                         {k: v.detach().cpu().numpy() for k, v in per_row.items()})


def combine(results: list[ShardGradient]) -> tuple[list[np.ndarray], float, dict[str, float], dict[str, np.ndarray]]:
    """Row-weighted means of the shards' gradients, losses and terms; per-row outputs concatenated."""
    total = sum(r.rows for r in results)
    share = [r.rows / total for r in results]
    grads = [sum(s * r.grads[i] for s, r in zip(share, results)) for i in range(len(results[0].grads))]
    loss = sum(s * r.loss for s, r in zip(share, results))
    terms = {k: sum(s * r.terms[k] for s, r in zip(share, results)) for k in results[0].terms}
    per_row = {k: np.concatenate([r.per_row[k] for r in results]) for k in results[0].per_row}
    return grads, loss, terms, per_row


def local_gradient_fn(replicas: list["ShardedLearner"]) -> GradientFn:
    """Shards computed one after another by in-process replicas (for tests, and for reasoning)."""
    def run(weights: Weights, shards: list[Samples]) -> list[ShardGradient]:
        return [shard_gradient(r, weights, s) for r, s in zip(replicas, shards)]
    return run


class ShardedLearner:
    """Mixin: `sharded_step` takes one optimizer step on samples, locally or through `gradient_fn`.

    Subclasses give `trained_module()` (the module whose parameters the optimizer steps) and
    `sample_loss(samples)`: the mean loss over the rows, diagnostic terms (scalars) and per-row
    outputs, with everything that needs the whole batch (targets, normalisation) already in the rows.
    """

    device: str = "cpu"
    gradient_fn: GradientFn | None = None
    num_shards: int = 1

    def trained_module(self) -> torch.nn.Module:
        raise NotImplementedError

    def sample_loss(self, samples: dict[str, torch.Tensor]):
        raise NotImplementedError

    def use_gradient_workers(self, gradient_fn: GradientFn | None, num_shards: int) -> None:
        self.gradient_fn, self.num_shards = gradient_fn, num_shards

    def sharded_step(self, samples: dict[str, torch.Tensor], step: Callable[[torch.Tensor | None], Step]):
        """(what `step` returned: (grad norm, skipped), loss, terms, per-row outputs), all tensors."""
        if self.gradient_fn is None or self.num_shards <= 1:
            loss, terms, per_row = self.sample_loss(samples)
            return step(loss), loss.detach(), {k: v.detach() for k, v in terms.items()}, \
                {k: v.detach() for k, v in per_row.items()}
        module = self.trained_module()
        shards = split_rows({k: tree.map(lambda x: x.detach().cpu().numpy(), v) for k, v in samples.items()},
                            self.num_shards)
        grads, loss, terms, per_row = combine(self.gradient_fn(to_numpy_weights(module), shards))
        for p, g in zip(module.parameters(), grads):
            p.grad = laid_out_as(p, g)
        as_t = lambda x: torch.as_tensor(x, device=self.device)  # noqa: E731
        return step(None), as_t(loss), {k: as_t(v) for k, v in terms.items()}, {k: as_t(v) for k, v in per_row.items()}
