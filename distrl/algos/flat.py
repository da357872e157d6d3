"""Torch parameters in one flat float32 buffer, and Adam over that buffer in numpy.

A hand-written numpy update beats autograd on CPU for small networks, where
per-op overhead, not arithmetic, is the cost. The torch modules stay: their
parameters are re-pointed at the buffer, so `state_dict`, checkpoints and
published weights see every numpy update without a copy.
"""
from __future__ import annotations

import math

import numpy as np
import torch


class FlatParams:
    """`tensors` re-pointed into `self.flat`; `self.views[i]` is tensor i as a numpy view."""

    def __init__(self, tensors: list[torch.Tensor]):
        sizes = [t.numel() for t in tensors]
        self.flat = np.empty(sum(sizes), np.float32)
        buffer = torch.from_numpy(self.flat)
        self.views: list[np.ndarray] = []
        self.slices: list[slice] = []
        offset = 0
        for t, n in zip(tensors, sizes):
            if t.dtype != torch.float32 or t.device.type != "cpu":
                raise ValueError(f"FlatParams takes float32 CPU tensors, got {t.dtype} on {t.device}")
            part = buffer[offset:offset + n]
            part.copy_(t.detach().reshape(-1))
            t.data = part.view(t.shape)  # same tensor object (optimizer, state_dict keys), new storage
            self.views.append(self.flat[offset:offset + n].reshape(t.shape))
            self.slices.append(slice(offset, offset + n))
            offset += n

    def like(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """A zeroed buffer of the same layout and its per-tensor views (for gradients)."""
        flat = np.zeros_like(self.flat)
        return flat, [flat[s].reshape(v.shape) for s, v in zip(self.slices, self.views)]


class FlatAdam:
    """Steps a flat buffer as `opt`, a torch Adam over the same tensors, would; `opt` keeps the hyperparameters.

    The moments live here during training and are written into `opt.state` only for
    a checkpoint, so checkpoints have torch's format whichever path wrote them.
    """

    def __init__(self, opt: torch.optim.Adam, flat: FlatParams, params: list[torch.Tensor]):
        self.opt, self.flat, self.params = opt, flat, params
        size = len(flat.flat)
        self.exp_avg = np.zeros(size, np.float32)
        self.exp_avg_sq = np.zeros(size, np.float32)
        self.lr = np.zeros(size, np.float32)
        self.steps = 0
        self._tmp = np.empty(size, np.float32)
        self.load_from_torch()

    def step(self, grads: np.ndarray) -> None:
        self.steps += 1
        m, v, tmp = self.exp_avg, self.exp_avg_sq, self._tmp
        m *= self.beta1
        m += (1.0 - self.beta1) * grads
        v *= self.beta2
        np.multiply(grads, grads, out=tmp)
        tmp *= 1.0 - self.beta2
        v += tmp
        np.sqrt(v, out=tmp)
        tmp *= 1.0 / math.sqrt(1.0 - self.beta2 ** self.steps)
        tmp += self.eps
        np.divide(m, tmp, out=tmp)
        tmp *= self.lr
        tmp *= 1.0 / (1.0 - self.beta1 ** self.steps)
        self.flat.flat -= tmp

    def save_to_torch(self) -> None:
        """Write the moments and step count into `opt.state` (then `opt.state_dict()` has them)."""
        for p, s in zip(self.params, self.flat.slices):
            self.opt.state[p] = {"step": torch.tensor(float(self.steps)),
                                 "exp_avg": torch.from_numpy(self.exp_avg[s]).view(p.shape),
                                 "exp_avg_sq": torch.from_numpy(self.exp_avg_sq[s]).view(p.shape)}

    def load_from_torch(self) -> None:
        """Take hyperparameters, moments and step count from `opt` (e.g. after its `load_state_dict`)."""
        where = {id(p): s for p, s in zip(self.params, self.flat.slices)}
        settings = set()
        for group in self.opt.param_groups:
            if group["weight_decay"] or group["amsgrad"] or group["maximize"]:
                raise ValueError("FlatAdam implements plain Adam: no weight decay, amsgrad or maximize")
            settings.add((tuple(group["betas"]), group["eps"]))
            for p in group["params"]:
                self.lr[where[id(p)]] = group["lr"]
        if len(settings) != 1:
            raise ValueError(f"FlatAdam needs one betas/eps for all param groups, got {sorted(settings)}")
        ((self.beta1, self.beta2), self.eps), = settings
        self.exp_avg[:] = 0.0
        self.exp_avg_sq[:] = 0.0
        steps = [0]
        for p, s in zip(self.params, self.flat.slices):
            state = self.opt.state.get(p)
            if state:  # a param torch never stepped (no gradient yet) has no state
                self.exp_avg[s] = state["exp_avg"].detach().reshape(-1).cpu().numpy()
                self.exp_avg_sq[s] = state["exp_avg_sq"].detach().reshape(-1).cpu().numpy()
                steps.append(int(float(state["step"])))
        self.steps = max(steps)
