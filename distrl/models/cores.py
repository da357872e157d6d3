"""Recurrent cores (LSTM, GRU) with one state layout for acting, storing and learning.

A state is float32 (..., S, size) with S = 2 for an LSTM ([0] = h, [1] = c) and S = 1 for a GRU: the
same array a worker keeps per env, the replay stores per sequence and the learner starts from.
Unrolls run torch's fused nn.LSTM / nn.GRU over the segments between episode starts, which is
faster on a CPU than a Python loop of cells.
"""
from __future__ import annotations

import itertools

import torch
from torch import nn


class RecurrentCore(nn.Module):
    static = False
    """Unroll a step at a time with every state masked, reading nothing back from the device (a learner
    whose update is a CUDA graph: `distrl.algos.capture.static_shapes`)."""

    def __init__(self, kind: str, in_features: int, size: int):
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"model.core: expected lstm or gru, got {kind!r}")
        self.lstm = kind == "lstm"
        self.core = (nn.LSTM if self.lstm else nn.GRU)(in_features, size)
        self.out_features = size
        self.state_shape = (2 if self.lstm else 1, size)

    def _to_hx(self, state: torch.Tensor):
        hx = state.transpose(0, 1).contiguous()  # (S, B, C): the core's layer-first layout
        return (hx[0:1], hx[1:2]) if self.lstm else hx

    def _from_hx(self, hx) -> torch.Tensor:
        return (torch.cat(hx, 0) if self.lstm else hx).transpose(0, 1)

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(output (B, C), next state (B, S, C)) of one step from x (B, F) and state (B, S, C)."""
        out, hx = self.core(x.unsqueeze(0), self._to_hx(state))
        return out[0], self._from_hx(hx)

    def unroll(self, x: torch.Tensor, state: torch.Tensor, first: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs (T, B, C), final state (B, S, C)) over x (T, B, F) from `state`; where `first` (T, B)
        is True the state is zeroed before that step (an episode starts there)."""
        hx = self._to_hx(state)
        if self.static and first is not None:
            return self._masked_unroll(x, hx, (~first).to(x.dtype).unsqueeze(-1))
        resets = [] if first is None else torch.nonzero(first.any(dim=1)).flatten().tolist()
        if resets:
            keep = (~first).to(x.dtype).unsqueeze(-1)  # (T, B, 1)
        outs = []
        for a, b in itertools.pairwise(sorted({0, *resets}) + [x.shape[0]]):
            if a in resets:
                hx = tuple(s * keep[a] for s in hx) if self.lstm else hx * keep[a]
            out, hx = self.core(x[a:b], hx)
            outs.append(out)
        return (outs[0] if len(outs) == 1 else torch.cat(outs)), self._from_hx(hx)

    def _masked_unroll(self, x: torch.Tensor, hx, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outs = []
        for t in range(x.shape[0]):
            hx = tuple(s * keep[t] for s in hx) if self.lstm else hx * keep[t]
            out, hx = self.core(x[t:t + 1], hx)
            outs.append(out)
        return torch.cat(outs), self._from_hx(hx)
