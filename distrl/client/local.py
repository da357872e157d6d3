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
STATE_INPUT, STATE_OUTPUT = "state", "state_out"  # a recurrent policy's state, before and after a step


class LocalActor:
    """Acts with one version of the weights: `act(obs, rng, state)` -> (action, extras, next state) for one
    observation, `act_rows` for a batch. An observation is given leaf by leaf, by name (`distrl.client.spaces`:
    a flat one's one leaf is named ""), each leaf one input of the file (a flat observation's: `obs`; a
    structured one's named by its path, its `action_mask` among them). A recurrent policy's file takes the
    state too (`state_shape` per row: zeros at an episode's start, then each step's next state); its extras
    hold the state each action was taken from. A feedforward one's next state is None."""

    def __init__(self, model: bytes, rule: dict, version: int):
        try:
            import onnxruntime as ort
        except ImportError:
            raise ImportError("local inference runs the exported network with onnxruntime: "
                              "pip install onnxruntime (or use inference='remote')") from None
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # a simulator's one row at a time
        self.session = ort.InferenceSession(bytes(model), options, providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs() if o.name not in ("action", STATE_OUTPUT)]
        self.inputs = {i.name for i in self.session.get_inputs()}
        state = [i.shape[1:] for i in self.session.get_inputs() if i.name == STATE_INPUT]
        self.state_shape = tuple(state[0]) if state else None
        self.version = version
        self.set_rule(rule)

    def set_rule(self, rule: dict) -> None:
        self.rule = rule_from_wire(rule)

    def initial_state(self, rows: int) -> np.ndarray | None:
        """`rows` episode starts' states (zeros), or None for a feedforward policy."""
        return None if self.state_shape is None else np.zeros((rows, *self.state_shape), np.float32)

    def act(self, obs: dict[str, np.ndarray], rng: np.random.Generator, state: np.ndarray | None = None):
        actions, extras, after = self.act_rows({name: np.asarray(x)[None] for name, x in obs.items()}, rng,
                                               None if state is None else np.asarray(state)[None])
        return actions[0], {k: v[0] for k, v in extras.items()}, None if after is None else after[0]

    def act_rows(self, obs: dict[str, np.ndarray], rng: np.random.Generator, state: np.ndarray | None = None
                 ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
        """(actions, extras, next states) for a batch of observations, one row each in every leaf, and a
        recurrent policy's states (one row each; None: episode starts): one pass of the network for all."""
        feed = {name or FLAT_INPUT: x for name, x in obs.items()}
        if self.state_shape is not None:
            feed[STATE_INPUT] = self.initial_state(len(next(iter(obs.values())))) if state is None else \
                np.asarray(state, np.float32)
        if set(feed) != self.inputs:
            raise ValueError(f"the model takes the inputs {sorted(self.inputs)}, the observation has {sorted(feed)}")
        if self.state_shape is None:
            values = self.session.run(self.outputs, feed)
            return (*self.rule.act(dict(zip(self.outputs, values)), rng, explore=True), None)
        *values, after = self.session.run([*self.outputs, STATE_OUTPUT], feed)
        actions, extras = self.rule.act(dict(zip(self.outputs, values)), rng, explore=True)
        extras["state"] = feed[STATE_INPUT]
        return actions, extras, after
