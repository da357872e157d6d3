"""The multi-agent protocol distrl's rollout workers step, and a PettingZoo adapter for it.

A `MultiAgentEnv` steps N agents at once with arrays, not dicts: actions (N,) int in,
an `MAStep` out (observations (N, *obs_shape), rewards (N,), an `active` mask and a
communication mask). It is not a gymnasium.Env because gymnasium rewards are scalars.

Meaning of the arrays after a step:
- `active[i]`: agent i has not left the episode. An agent leaves when it is done by its own
  task (PettingZoo: terminated or truncated while others go on); from then on it is False.
  At the episode's last step, agents cut by the end (truncation, or still acting when the
  episode terminates) stay True: their observation rows are the final observations a learner
  bootstraps from.
- `obs[i]` is zero where `active[i]` is False (an action mask allows every action there);
  `rewards[i]` is the reward of the step for every agent that was active before it (including the
  step on which it leaves), 0 otherwise.
- `comm_mask[i, j]`: i may receive a message from j. Always False on the diagonal and for
  inactive agents (rows and columns). It is computed from the env state at each step so a
  worker can store it with the experience and the learner can reuse it on replay.
- `state`: the env's global state (float32, `state_space`'s shape), or None where it has none: what a
  central critic may read at training time (MAPPO's `mappo.central_input: state`).

`ParallelEnvAdapter` wraps any PettingZoo `ParallelEnv`:
- Agents are indexed in `possible_agents` order. Agents absent from `env.agents` are inactive.
- Observations: a Box, or a Dict or Tuple of leaves, with an action mask (`env.action_mask`), made
  one space for every agent by `distrl.envs.multiagent_obs`: a Box of one shape for every agent is
  kept (so an image stays (C, H, W)); of differing shapes it is flattened and zero-padded at the end
  to the largest size (bounds padded with 0); a structured observation follows that rule leaf by
  leaf, `obs` then being a tree of (N, ...) arrays. Action spaces must be `Discrete` of one size
  (actions are 0-based: the space's `start` is added for the env), or one `Box` shared by every
  agent (MPE's `continuous_actions: true`; actions (N, *shape)).
- Episode end: when no agent is live. `terminated` if every agent that was live before the last
  step terminated, else `truncated`.
- Communication mask, first that applies: the `comm_fn(env, active)` given; the env's own
  `comm_mask()` method (`ParallelView` has one); with `comm_k` and/or `comm_radius`, each agent's
  k nearest active agents by Euclidean distance (ties: lower index) among those within the radius
  on every axis (a square view, as the MAPF field of view), positions from the env's
  `agent_positions()` or MPE's `env.unwrapped.world.agents[i].state.p_pos`; otherwise all pairs
  of active agents. `make_multiagent_env` takes `comm_k` and `comm_radius` from `env.kwargs`
  when the env's constructor refuses them (the MAPF gridworld takes `comm_k` itself).
- Global state: PettingZoo's `env.state()` where the env has a Box `state_space` (MPE's simple_spread:
  every agent's observation, concatenated: (54,) for 3 agents), as float32; otherwise None.
- `info` at the end: `return_mean` (mean per-agent return over all possible agents) plus the
  float entries of any agent's `infos[agent]["episode"]` dict (how the MAPF view passes its
  episode metrics through).

`ParallelView` is the other direction: any `MultiAgentEnv` behind the PettingZoo Parallel API
(how the MAPF gridworld exposes it).
"""
from __future__ import annotations

import abc
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

from distrl import tree
from distrl.envs.comm import comm_limits_problem, comm_mask_from_positions, env_positions
from distrl.envs.factory import EnvError, import_module_of
from distrl.envs.multiagent_obs import AgentObservations


@dataclass
class MAStep:
    """What a reset or step returns; the arrays are (N, ...) over all agents (module docstring)."""

    obs: np.ndarray  # or a tree of (N, ...) arrays (`distrl.tree`) for a structured observation
    rewards: np.ndarray
    terminated: bool
    truncated: bool
    active: np.ndarray
    comm_mask: np.ndarray
    info: dict = field(default_factory=dict)
    state: np.ndarray | None = None


class MultiAgentEnv(abc.ABC):
    """N agents sharing one observation space (a Box; Dict and Tuple ones for MAPPO) and one action space
    (Discrete, or a Box for MAPPO)."""

    num_agents: int
    observation_space: spaces.Space
    action_space: spaces.Discrete
    state_space: spaces.Box | None = None
    """The space of `MAStep.state` (float32), None for an env without a global state."""

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> MAStep:
        """Start an episode (rewards 0, terminated/truncated False)."""

    @abc.abstractmethod
    def step(self, actions: np.ndarray) -> MAStep:
        """Step every active agent; actions of inactive agents are ignored."""

    def close(self) -> None:
        """Release resources."""


def _state_space(env: Any) -> spaces.Box | None:
    """A PettingZoo env's `state_space` as float32 (what `MAStep.state` holds), or None where it has no Box
    one (PettingZoo's wrappers copy the attribute only where the env has it)."""
    try:
        space = getattr(env, "state_space", None)  # None on an AttributeError
    except NotImplementedError:  # a property that exists and refuses
        return None
    if not isinstance(space, spaces.Box) or not callable(getattr(env, "state", None)):
        return None
    return spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), dtype=np.float32)


class ParallelEnvAdapter(MultiAgentEnv):
    """A PettingZoo ParallelEnv as a `MultiAgentEnv` (rules in the module docstring)."""

    def __init__(self, env: Any, comm_fn: Callable[[Any, np.ndarray], np.ndarray] | None = None,
                 comm_k: int | None = None, comm_radius: float | None = None, obs_keys: list | None = None,
                 action_mask: str = "auto"):
        self.env = env
        self.agent_ids = list(env.possible_agents)
        self.num_agents = len(self.agent_ids)
        self.comm_fn = comm_fn
        self.comm_k, self.comm_radius = comm_k, comm_radius
        self._own_comm = callable(getattr(env, "comm_mask", None))
        problem = comm_limits_problem(env, comm_k, comm_radius, comm_fn)
        if problem:
            raise EnvError(problem)
        self._setup_spaces(obs_keys, action_mask)
        self.state_space = _state_space(env)
        self._live = np.zeros(self.num_agents, bool)
        self._returns = np.zeros(self.num_agents, np.float64)
        self._over, self._steps = True, 0

    def _setup_spaces(self, obs_keys: list | None, action_mask: str) -> None:
        act_spaces = [self.env.action_space(a) for a in self.agent_ids]
        self._box = all(isinstance(s, spaces.Box) for s in act_spaces)
        if self._box:  # continuous actions (MPE's continuous_actions): one Box, the same for every agent
            if any(s != act_spaces[0] for s in act_spaces):
                raise EnvError(f"Box action spaces must be one and the same for every agent, got {act_spaces[:3]}...")
            self._starts, self.action_space = [0] * len(act_spaces), act_spaces[0]
        elif not all(isinstance(s, spaces.Discrete) for s in act_spaces) or len({int(s.n) for s in act_spaces}) != 1:
            raise EnvError(f"action spaces must be Discrete of one size, or one Box, got {act_spaces[:3]}...")
        else:
            self._starts = [int(s.start) for s in act_spaces]
            self.action_space = spaces.Discrete(int(act_spaces[0].n))
        self._observations = AgentObservations(self.env, self.agent_ids, self.action_space, obs_keys, action_mask)
        self.observation_space = self._observations.space

    def _obs_array(self, obs: dict, infos: dict | None) -> tree.Tree:
        return self._observations.stack(obs, infos or {}, self._live, self._steps)

    def comm_mask(self) -> np.ndarray:
        active = self._live
        if self.comm_fn is not None:
            mask = np.asarray(self.comm_fn(self.env, active), bool)
        elif self._own_comm:
            mask = np.asarray(self.env.comm_mask(), bool)
        elif self.comm_k is not None or self.comm_radius is not None:
            pos = env_positions(self.env)
            known = active & ~np.isnan(pos).any(axis=1)
            mask = comm_mask_from_positions(np.nan_to_num(pos), known, self.comm_k, self.comm_radius)
        else:
            mask = np.ones((self.num_agents, self.num_agents), bool)
        mask = mask & active[:, None] & active[None, :]
        np.fill_diagonal(mask, False)
        return mask

    def reset(self, seed: int | None = None) -> MAStep:
        obs, infos = self.env.reset(seed=seed)
        live = set(self.env.agents)
        self._live = np.array([a in live for a in self.agent_ids])
        self._returns[:] = 0.0
        self._over, self._steps = False, 0
        return MAStep(self._obs_array(obs, infos), np.zeros(self.num_agents, np.float32), False, False,
                      self._live.copy(), self.comm_mask(), {}, self._state())

    def step(self, actions: np.ndarray) -> MAStep:
        if self._over:
            raise RuntimeError("step() after the episode ended: call reset()")
        actions = np.asarray(actions).reshape(self.num_agents, *self.action_space.shape)
        before = self._live
        live_now = set(self.env.agents)
        acts = {a: actions[i] if self._box else int(actions[i]) + self._starts[i]
                for i, a in enumerate(self.agent_ids) if a in live_now}
        obs, rew, term, trunc, infos = self.env.step(acts)
        rewards = np.array([float(rew.get(a, 0.0)) for a in self.agent_ids], np.float32) * before
        terms = np.array([bool(term.get(a, False)) for a in self.agent_ids])
        truncs = np.array([bool(trunc.get(a, False)) for a in self.agent_ids])
        listed = set(self.env.agents)
        live = np.array([a in listed for a in self.agent_ids]) & ~terms & ~truncs
        self._over = not live.any()
        if self._over:
            live = before & ~terms  # agents cut by the end keep their final observation
        self._live = live
        self._returns += rewards
        self._steps += 1
        truncated = self._over and bool(live.any())
        info = self._episode_info(infos) if self._over else {}
        return MAStep(self._obs_array(obs, infos), rewards, self._over and not truncated, truncated,
                      live.copy(), self.comm_mask(), info, self._state())

    def _state(self) -> np.ndarray | None:
        if self.state_space is None:
            return None
        return np.asarray(self.env.state(), np.float32).reshape(self.state_space.shape)

    def render(self):
        """The PettingZoo env's frame when it was built with render_mode="rgb_array", else None."""
        return self.env.render() if getattr(self.env, "render_mode", None) == "rgb_array" else None

    def _episode_info(self, infos: dict) -> dict:
        info: dict[str, float] = {}
        for a in self.agent_ids:
            ep = infos.get(a, {}).get("episode") if isinstance(infos.get(a), dict) else None
            if isinstance(ep, dict):
                info.update({k: float(v) for k, v in ep.items() if isinstance(v, (int, float, np.number))})
                break
        info["return_mean"] = float(self._returns.mean())
        return info

    def close(self) -> None:
        self.env.close()


class ParallelView(ParallelEnv):
    """Any `MultiAgentEnv` behind the PettingZoo Parallel API, agents "agent_0".. in index order.

    An agent that becomes inactive is terminated and leaves `agents`; at the episode's end every
    remaining agent is terminated or truncated as the episode is. Missing actions are 0. The
    episode metrics are in each agent's final `infos[agent]["episode"]`. Reset options are passed
    to the env's `reset_to(**options)` if it has one (the MAPF gridworld: a given map).
    """

    def __init__(self, env: MultiAgentEnv, name: str = "distrl_multiagent"):
        self.env = env
        self.metadata = {"name": name, "render_modes": [], "is_parallelizable": True}
        self.possible_agents = [f"agent_{i}" for i in range(env.num_agents)]
        self.agents: list[str] = []
        self.observation_spaces = {a: spaces.Box(env.observation_space.low, env.observation_space.high,
                                                 dtype=np.float32) for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(int(env.action_space.n)) for a in self.possible_agents}
        self._last: MAStep | None = None

    def observation_space(self, agent):
        return self.observation_spaces[agent]

    def action_space(self, agent):
        return self.action_spaces[agent]

    def reset(self, seed=None, options=None):
        reset_to = getattr(self.env, "reset_to", None)
        st = self.env.reset_to(**options) if options and _accepts(reset_to, options) else self.env.reset(seed)
        self._last = st
        self.agents = [a for a, act in zip(self.possible_agents, st.active) if act]
        return {a: st.obs[int(a[6:])] for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        live, ids = self.agents, [int(a[6:]) for a in self.agents]
        arr = np.zeros(self.env.num_agents, np.int64)
        for a, act in actions.items():
            arr[int(a[6:])] = act
        st = self._last = self.env.step(arr)
        over = st.terminated or st.truncated
        term = {a: bool(st.terminated or not st.active[i]) for a, i in zip(live, ids)}
        trunc = {a: bool(st.truncated) and not term[a] for a in live}
        obs = {a: st.obs[i] for a, i in zip(live, ids)}
        rew = {a: float(st.rewards[i]) for a, i in zip(live, ids)}
        infos = {a: ({"episode": st.info} if over else {}) for a in live}
        self.agents = [] if over else [a for a, i in zip(live, ids) if st.active[i]]
        return obs, rew, term, trunc, infos

    def comm_mask(self) -> np.ndarray:
        """The mask of the last reset or step."""
        return self._last.comm_mask

    def close(self) -> None:
        self.env.close()


def _accepts(fn: Any, kwargs: dict) -> bool:
    """`fn` can be called with `kwargs` (options meant for someone else are ignored: pettingzoo's API
    test passes some)."""
    try:
        inspect.signature(fn).bind(**kwargs)
        return callable(fn)
    except (TypeError, ValueError):
        return False


def _is_parallel_env(obj: Any) -> bool:
    return all(hasattr(obj, name) for name in ("possible_agents", "reset", "step", "observation_space"))


def _resolve(env_id: str) -> Any:
    """The class, module or callable `env_id` names, or EnvError naming `env.id`."""
    if ":" not in env_id:
        raise EnvError(f"config key 'env.id': {env_id!r} must look like module:Name "
                       "(e.g. distrl.envs.mapf:MAPF or mpe2:simple_spread_v3)")
    mod, name = import_module_of(env_id)
    module = mod.__name__
    obj = getattr(mod, name, None)
    if obj is None:
        try:  # a submodule not imported by its package (mpe2:simple_spread_v3)
            obj = importlib.import_module(f"{module}.{name}")
        except ImportError:
            raise EnvError(f"config key 'env.id': {module!r} has no {name!r}") from None
    return obj


ADAPTER_KEYS = ("comm_k", "comm_radius")  # env.kwargs the adapter takes when the env's constructor refuses them


def _construct(obj: Any, env_id: str, kwargs: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """(obj(**kwargs), the `ADAPTER_KEYS` its constructor refused, left for the adapter)."""
    kwargs, refused = dict(kwargs or {}), {}
    while True:
        try:
            return obj(**kwargs), refused
        except (TypeError, ValueError) as e:
            key = next((k for k in ADAPTER_KEYS if k in kwargs and f"'{k}'" in str(e)), None)
            if key is None or not isinstance(e, TypeError):
                raise EnvError(f"config key 'env.kwargs': {env_id} rejected them: {e}") from None
            refused[key] = kwargs.pop(key)


def make_multiagent_env(env_id: str, kwargs: dict[str, Any] | None = None, obs_keys: list | None = None,
                        action_mask: str = "auto") -> MultiAgentEnv:
    """Build `env_id`: a `MultiAgentEnv` class, a module exposing `parallel_env(**kwargs)`, or a
    callable returning a ParallelEnv or a MultiAgentEnv. `comm_k` and `comm_radius` in `kwargs`
    go to the env when its constructor takes them, else to the PettingZoo adapter; `obs_keys` and
    `action_mask` (env.obs_keys, env.action_mask) to the adapter."""
    obj = _resolve(env_id)
    if inspect.ismodule(obj):
        if not callable(getattr(obj, "parallel_env", None)):
            raise EnvError(f"config key 'env.id': module {obj.__name__!r} has no parallel_env(**kwargs)")
        obj = obj.parallel_env
    if not callable(obj):
        raise EnvError(f"config key 'env.id': {env_id!r} is not a class, module or callable")
    env, adapter_kwargs = _construct(obj, env_id, kwargs)
    if isinstance(env, MultiAgentEnv):
        if adapter_kwargs:
            env.close()
            raise EnvError(f"config key 'env.kwargs': {env_id} takes no {', '.join(adapter_kwargs)}")
        if obs_keys is not None or action_mask in ("obs", "info"):
            env.close()
            key = "env.obs_keys" if obs_keys is not None else "env.action_mask"
            raise EnvError(f"config key '{key}': {env_id} is a distrl MultiAgentEnv, whose observations are its "
                           "own (these keys are for PettingZoo envs)")
        return env
    if not _is_parallel_env(env):
        raise EnvError(f"config key 'env.id': {env_id!r} built a {type(env).__name__}, "
                       "neither a MultiAgentEnv nor a PettingZoo ParallelEnv")
    problem = comm_limits_problem(env, adapter_kwargs.get("comm_k"), adapter_kwargs.get("comm_radius"))
    if problem:
        env.close()
        raise EnvError(f"config key 'env.kwargs': {env_id}: {problem}")
    try:
        return ParallelEnvAdapter(env, **adapter_kwargs, obs_keys=obs_keys, action_mask=action_mask)
    except EnvError as e:
        keyed = str(e).startswith("config key")
        raise EnvError(f"{e} ({env_id})" if keyed else f"config key 'env.id': {env_id}: {e}") from None
