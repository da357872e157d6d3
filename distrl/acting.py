"""How a policy's `forward` runs for a vector of envs, each env with its recurrent state: in the policy's
own process (`LocalInference`), or batched with other workers' envs (`batched_forward`, which an
inference server runs). Knows policies only by their `forward` and `initial_state`."""
from __future__ import annotations

import abc

import numpy as np

from distrl import tree


class EnvStates:
    """Each env's recurrent state for a policy's `forward`: zeros at an episode start."""

    def __init__(self, policy):
        self.policy = policy
        self.state: np.ndarray | None = None  # after the last step: held nowhere else, so resets write in place

    def current(self, rows: int) -> np.ndarray | None:
        """The state before the next step of `rows` envs (a fresh one when the count changed)."""
        if self.state is None or len(self.state) != rows:
            self.state = self.policy.initial_state(rows)
        return self.state

    def reset(self, done: np.ndarray) -> None:
        done = np.asarray(done, bool)
        if self.state is not None and len(self.state) == len(done) and done.any():
            self.state[done] = self.policy.initial_state(int(done.sum()))


Observation = tree.Tree
"""A batch of observations: a tree of arrays with one leading row axis (`distrl.tree`; a multi-agent env's
named arrays too)."""


def rows_of(obs: Observation) -> int:
    return tree.rows(obs)


def concat_rows(parts: list[Observation]) -> Observation:
    return tree.concatenate([tree.as_arrays(p) for p in parts])


def batched_forward(policy, requests: list[tuple[EnvStates, Observation]]) -> list[dict[str, np.ndarray]]:
    """One `forward` over the rows of several requests (each a vector of envs with its states), split back
    per request; each request's states advance, and its outputs carry 'state', the one before the step."""
    befores = [states.current(rows_of(obs)) for states, obs in requests]
    if len(requests) == 1:  # the local path: no copies
        out, after = policy.forward(requests[0][1], befores[0])
        requests[0][0].state = after
        return [out if after is None else {**out, "state": befores[0]}]
    state = None if befores[0] is None else np.concatenate(befores)
    out, after = policy.forward(concat_rows([o for _, o in requests]), state)
    if state is not None:
        out = {**out, "state": state}
    cuts = np.cumsum([rows_of(o) for _, o in requests])[:-1]
    parts = [dict(zip(out, split)) for split in zip(*(np.split(v, cuts) for v in out.values()))]
    if after is not None:
        for (states, _), piece in zip(requests, np.split(after, cuts)):
            states.state = piece
    return parts


class Inference(abc.ABC):
    """Where a policy's `forward` runs for a worker: in its own process, or on an inference server."""

    @abc.abstractmethod
    def step(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        """Outputs for the envs' observations, advancing their states ('state': the one before)."""

    @abc.abstractmethod
    def forward(self, obs: np.ndarray, state: np.ndarray | None) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """`Policy.forward` on rows outside the envs' flow."""

    @abc.abstractmethod
    def reset(self, done: np.ndarray) -> None:
        """These envs start new episodes."""


class LocalInference(Inference):
    """`forward` in the policy's own process, with the weights it was given."""

    def __init__(self, policy):
        self.policy, self.states = policy, EnvStates(policy)

    def step(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        return batched_forward(self.policy, [(self.states, obs)])[0]

    def forward(self, obs, state):
        return self.policy.forward(obs, state)

    def reset(self, done: np.ndarray) -> None:
        self.states.reset(done)
