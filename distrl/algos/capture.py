"""A replay learner's update as one CUDA graph: forward, backward and optimizer step launched at once.

A learner on a GPU with small batches is bound by Python and kernel launches, not by the GPU (~150
launches per Ape-X update). Replay learners see batches of one layout (keys, shapes, dtypes), so their
update's device work (`fn`: tensors in, tensors out, no read of the device and no branch on the data) is
recorded once per layout and replayed; what depends on the host (update counts, periodic target copies)
stays outside. The plain path runs on the CPU, on a GPU when `learner.cuda_graph` is off, and for
updates whose shapes vary or that go through gradient workers.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from distrl import tree

Tensors = dict[str, torch.Tensor]


def capturable(device: str, enabled: bool) -> bool:
    """Whether a learner on `device` records its update as a CUDA graph (`enabled`: learner.cuda_graph)."""
    return enabled and str(device).startswith("cuda") and torch.cuda.is_available()


def static_shapes(*modules: nn.Module) -> None:
    """Tell every part of `modules` that branches on data to take its branch-free path (recurrent cores
    unroll a step at a time with every state masked, instead of splitting at episode starts they read)."""
    for module in modules:
        for part in module.modules():
            if hasattr(part, "static"):
                part.static = True


class GraphedStep:
    """`fn(batch) -> outputs` recorded as one CUDA graph per batch layout and replayed on each batch.

    The warm-up steps that recording needs (on a side stream) are real steps: the weights and buffers of
    `modules` and the optimizer's state are put back as they were before them, so the first replayed
    update is the learner's first. Outputs are copied out of the graph's memory, which the next replay
    overwrites. After an optimizer's state is replaced (a checkpoint loaded), call `reset`.
    """

    def __init__(self, fn: Callable[[Tensors], Tensors], modules: list[nn.Module], optimizer: torch.optim.Optimizer,
                 warmup: int = 3):
        self.fn, self.modules, self.optimizer, self.warmup = fn, modules, optimizer, warmup
        self.graphs: dict[tuple, tuple[Tensors, torch.cuda.CUDAGraph, Tensors]] = {}
        self.pool = None  # one memory pool for every layout's graph

    def reset(self) -> None:
        self.graphs.clear()

    def __call__(self, batch: Tensors) -> Tensors:
        layout = tuple((k, n, tuple(x.shape), x.dtype) for k, v in sorted(batch.items()) for n, x in tree.named_leaves(v))
        if layout not in self.graphs:
            self.graphs[layout] = self._record(batch)
        inputs, graph, outputs = self.graphs[layout]
        for k, v in batch.items():
            for dst, src in zip(tree.leaves(inputs[k]), tree.leaves(v)):
                dst.copy_(src, non_blocking=True)
        graph.replay()
        return {k: v.clone() for k, v in outputs.items()}

    def _state(self) -> list[torch.Tensor]:
        tensors = [t for m in self.modules for t in m.state_dict(keep_vars=True).values()]
        tensors += [p for group in self.optimizer.param_groups for p in group["params"]]
        return tensors

    def _record(self, batch: Tensors):
        inputs = {k: tree.map(lambda x: x.clone(), v) for k, v in batch.items()}
        before = [t.detach().clone() for t in self._state()]
        opt_before = {id(t): t.detach().clone() for s in self.optimizer.state.values() for t in s.values()
                      if torch.is_tensor(t)}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # gradients allocated by the graph, written each replay
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self.fn(inputs)
        self.pool = graph.pool()
        with torch.no_grad():  # undo the warm-up's steps; state Adam created in them starts at zero, as new
            for t, saved in zip(self._state(), before):
                t.copy_(saved)
            for s in self.optimizer.state.values():
                for t in s.values():
                    if torch.is_tensor(t):
                        t.copy_(opt_before[id(t)]) if id(t) in opt_before else t.zero_()
        return inputs, graph, outputs
