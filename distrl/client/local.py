"""Local inference on a simulator's side: the run's acting network as an ONNX file, run by onnxruntime, and
the policy's own acting rule (`distrl.sampling`) on its outputs.

onnxruntime rather than numpy: the file is the network the run trained, exported by torch (any torso,
convolutions and uint8 frames included), so the client carries no second implementation of it; and the
same file is what `distrl export` writes for deployment.
"""
from __future__ import annotations

import numpy as np

from distrl.sampling import rule_from_wire

FLAT_INPUT = "obs"  # a flat observation's one input (`distrl.models.export`)


class LocalActor:
    """Acts with one version of the weights: `act(obs, rng)` -> (action, extras) for one observation,
    `act_rows` for a batch. An observation is given leaf by leaf, by name (`distrl.client.spaces`: a flat
    one's one leaf is named ""), each leaf one input of the file (a flat observation's: `obs`; a structured
    one's named by its path, its `action_mask` among them)."""

    def __init__(self, model: bytes, rule: dict, version: int):
        try:
            import onnxruntime as ort
        except ImportError:
            raise ImportError("local inference runs the exported network with onnxruntime: "
                              "pip install onnxruntime (or use inference='remote')") from None
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # a simulator's one row at a time
        self.session = ort.InferenceSession(bytes(model), options, providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs() if o.name != "action"]
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.version = version
        self.set_rule(rule)

    def set_rule(self, rule: dict) -> None:
        self.rule = rule_from_wire(rule)

    def act(self, obs: dict[str, np.ndarray], rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        actions, extras = self.act_rows({name: np.asarray(x)[None] for name, x in obs.items()}, rng)
        return actions[0], {k: v[0] for k, v in extras.items()}

    def act_rows(self, obs: dict[str, np.ndarray], rng: np.random.Generator
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(actions, extras) for a batch of observations, one row each in every leaf: one pass of the network
        for all."""
        feed = {name or FLAT_INPUT: x for name, x in obs.items()}
        if set(feed) != self.inputs:
            raise ValueError(f"the model takes the inputs {sorted(self.inputs)}, the observation has {sorted(feed)}")
        values = self.session.run(self.outputs, feed)
        return self.rule.act(dict(zip(self.outputs, values)), rng, explore=True)
