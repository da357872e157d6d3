"""Action masks inside a network: masked actions' logits (or Q-values) set to MASKED, so every consumer
of the head's output (sampling in numpy, log-probs and entropies in torch, argmax, an exported file) gives
them zero probability without knowing masks exist. A finite number, not -inf: a masked logit minus the
row's largest stays finite, so p log p is 0 * (-1e9) = 0, never 0 * -inf = NaN."""
from __future__ import annotations

import torch

from distrl.sampling import MASKED


def apply_mask(out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`out` (B, A) with entries whose `mask` (B, A; 1 = legal) is 0 set to MASKED; `out` itself without a mask."""
    if mask is None:
        return out
    return out.masked_fill(mask == 0, MASKED)
