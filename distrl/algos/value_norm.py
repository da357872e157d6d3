"""A value head that learns standardized returns (PopArt, van Hasselt et al. 2016; MAPPO's value normalization).

The head's linear layer predicts the return standardized by running statistics of the value targets, and its
output is that prediction mapped back, mean + std * (w h + b): GAE, V-trace and bootstraps read values in the
env's units as with a plain head, while the value loss compares standardized values (`normalize`), so its
scale, and its share of a clipped gradient norm, does not depend on the rewards'. When the statistics move,
w and b are rescaled so that every output stays what it was (PopArt's "preserving outputs").
"""
from __future__ import annotations

import torch
from torch import nn

DECAY = 0.99  # per update: the statistics follow the returns of about the last 100 batches
MIN_VAR = 1e-4  # a floor for the variance: a batch of equal returns does not blow the standardized loss up


class NormalizedValueHead(nn.Module):
    """`linear` (features -> 1) predicting standardized returns; outputs (..., 1) in the returns' units. The
    statistics are buffers: they travel with the weights and checkpoints."""

    def __init__(self, linear: nn.Linear, decay: float = DECAY):
        super().__init__()
        self.linear, self.decay = linear, decay
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("mean_sq", torch.ones(()))
        self.register_buffer("weight", torch.zeros(()))  # the debiasing sum of the moving average's weights

    @property
    def std(self) -> torch.Tensor:
        return (self.mean_sq - self.mean.square()).clamp(min=MIN_VAR).sqrt()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h) * self.std + self.mean

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """Values or returns in the env's units, standardized by the current statistics."""
        return (values - self.mean) / self.std

    @torch.no_grad()
    def update(self, returns: torch.Tensor, live: torch.Tensor | None = None) -> None:
        """Move the statistics toward those of `returns` (the entries where `live` is 1, when given), keeping
        every output of the head as it was."""
        w = torch.ones_like(returns) if live is None else live.to(returns.dtype)
        count = w.sum()
        seen = (count > 0).to(returns.dtype)  # a batch with no live entry changes nothing (no read of the device)
        count = count.clamp(min=1.0)
        batch_mean, batch_sq = (returns * w).sum() / count, (returns.square() * w).sum() / count
        old_mean, old_std = self.mean.clone(), self.std
        step = (1.0 - self.decay) * seen
        weight = (1.0 - step) * self.weight + step
        rate = step / weight.clamp(min=1e-12)  # debiased: the first batch's own statistics, then an average
        self.mean.add_(rate * (batch_mean - self.mean))
        self.mean_sq.add_(rate * (batch_sq - self.mean_sq))
        self.weight.copy_(weight)
        std = self.std
        self.linear.weight.mul_(old_std / std)
        self.linear.bias.copy_((old_std * self.linear.bias + old_mean - self.mean) / std)
