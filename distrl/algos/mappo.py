"""MAPPO (Yu et al., 2022) and IPPO: PPO with one set of weights acting for every agent of a multi-agent env.

Agents are rows of the batch: a worker's E envs of N agents act as E * N rows, and a fragment stores them
as E * N columns of the time-major (T, B) layout PPO's learner takes, so GAE, V-trace, the clipped
surrogate, the minibatches and a recurrent core's sequences are PPO's own (`distrl.algos.ppo`). What is
multi-agent is what a row holds and which rows count:

- a row's observation is a tree: `own` (the agent's observation: an array, or its Dict or Tuple tree) and
  `agent` (its index, one-hot encoded by the torso: parameter sharing can still tell agents apart), all the
  actor reads (`ACTOR_KEYS`); the agent's action mask, where the env gives one, as the row's `action_mask`
  (the heads mask the logits there, in acting and in the learner's log-probs and entropies, as for one
  agent); and, for the central critic, `joint` (every agent's observation, concatenated leaf by leaf:
  each agent's leaf flattened, a Discrete leaf one integer per agent) or `state` (the env's global state,
  `MAStep.state`), by `mappo.central_input`: the critic's input at training time only;
- `mappo.critic: central` (MAPPO) has the value network read that leaf and `agent`, `local` (IPPO) `own`
  and `agent`;
- an agent that left its episode early (PettingZoo: terminated while others go on) ends there, as its own
  column's termination; the rows of agents no longer in the episode are kept out of the losses and of the
  advantages' normalization (`live`);
- rewards, returns and advantages are per agent; an episode's truncation bootstraps every agent still in it;
- with `mappo.time_limit` the critic also reads `time`, the fraction of the limit the episode has left (the
  policy counts each env's steps), and an episode cut at the limit ends there: V depends on the time left,
  which no agent's observation tells; with `mappo.value_norm` the critic's head learns standardized returns
  (`distrl.algos.value_norm`).

With `model.core` the actor is torso -> core -> head with a state per agent row: a worker keeps (E, N, S, C),
zeroed for every agent of an env whose episode ends (all of them start the next one together), a fragment
stores its columns' states before its first step, and the learner unrolls each column as PPO unrolls an
env's. The critic stays feedforward (its own torso, no state), since its inputs are the learner's only: a
central critic's joint observation or state is what it sees instead of memory.

Acting runs the actor alone (`ActorCriticNet.actor_outputs`, `actor_step` with a core) on each agent's row,
which is also what `distrl export` writes: one agent's actor, inputs `action_mask` (where masked), `agent`
and `own` (one per leaf of a structured one), and `state` with a core.

The env goes through the multi-agent adapter DHC uses (`distrl.envs.multiagent`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from distrl import tree
from distrl.algos.actor_critic import ActorCriticNet, action_factors
from distrl.algos.actor_critic_acting import ActorCriticPolicy
from distrl.algos.common import stored_obs
from distrl.algos.ppo import PPO, PPOConfig, PPOLearner
from distrl.algos.value_norm import NormalizedValueHead
from distrl.config.fields import f
from distrl.core import Batch, Trajectory
from distrl.envs.multiagent_obs import without_mask
from distrl.models import RecurrentCore, make_torso
from distrl.models.multi_input import image_leaf

ACTOR_KEYS = ("own", "agent")  # what an agent has when it acts on its own (with its mask: all an exported actor takes)
TIME_KEY = "time"  # the critic's: the fraction of `mappo.time_limit` an episode has left at the step


@dataclass
class MAPPOConfig(PPOConfig):
    critic: str = f("central", "the value network's input: central (MAPPO: mappo.central_input, and the agent's "
                    "index) | local (IPPO: the agent's own observation and index)", choices=("central", "local"))
    central_input: str = f("joint", "what the central critic reads: joint (every agent's observation, "
                           "concatenated) | state (the env's global state, PettingZoo's state())",
                           choices=("joint", "state"))
    value_norm: bool = f(False, "the critic learns returns standardized by running statistics (PopArt's value head, "
                         "distrl.algos.value_norm): the value loss's scale does not depend on the rewards'")
    time_limit: int | None = f(None, "steps an episode lasts at most (the env's time limit: MPE's max_cycles): the "
                               "critic also reads the fraction of it left, and an episode cut there ends (no "
                               "bootstrap); null = the critic does not see time", lo=1)


def split_mask(obs: tree.Tree) -> tuple[tree.Tree, np.ndarray | None]:
    """(the observation without its action mask, the mask or None): the mask is a row's own leaf."""
    mask = tree.mask_of(obs)
    return (obs, None) if mask is None else ({k: v for k, v in obs.items() if k != tree.MASK_KEY}, mask)


def agent_rows(obs: tree.Tree, lead: int, central: str | None = None,
               state: np.ndarray | None = None) -> dict[str, tree.Tree]:
    """Per-agent rows of observations whose leaves are (..., N, ...) (`lead`: the axes up to N's): the tree
    each agent's row holds (module docstring), with the same leading (..., N) axes; `central`: the central
    critic's leaf, joint or state (the global state (..., *state_shape), given as `state`), or None."""
    own, mask = split_mask(obs)
    shape = tree.leaves(own)[0].shape[:lead]
    rows = {"own": own, "agent": np.broadcast_to(np.arange(shape[-1], dtype=np.int64), shape).copy()}
    if mask is not None:
        rows[tree.MASK_KEY] = mask
    if central == "joint":  # each leaf: every agent's flattened, in each agent's row
        rows["joint"] = tree.map(lambda x: _every_row(x.reshape(*shape[:-1], 1, -1), shape), own)
    elif central == "state":
        rows["state"] = _every_row(np.expand_dims(state, lead - 1), shape)
    return rows


def _every_row(whole: np.ndarray, shape: tuple) -> np.ndarray:
    """`whole` (..., 1, ...), one per env, in every agent's row of its env: (*shape, ...)."""
    return np.broadcast_to(whole, (*shape, *whole.shape[len(shape):])).copy()


def joint_space(space, n: int):
    """The space of `agent_rows`' joint leaf for one agent's observation `space` (no mask) and `n` agents."""
    def joint(s):
        if isinstance(s, spaces.Box):
            return spaces.Box(np.tile(s.low.reshape(-1), n), np.tile(s.high.reshape(-1), n), dtype=s.dtype)
        if isinstance(s, spaces.Discrete):
            return spaces.MultiDiscrete(np.full(n, s.n), start=np.full(n, s.start))
        if isinstance(s, spaces.MultiDiscrete):
            start = np.broadcast_to(s.start, s.nvec.shape).reshape(-1)
            return spaces.MultiDiscrete(np.tile(s.nvec.reshape(-1), n), start=np.tile(start, n))
        return spaces.MultiBinary(n * int(np.prod(s.shape)))
    return tree.as_space(tree.unflatten_like(tree.space_tree(space), [joint(s) for _, s in tree.leaf_spaces(space)]))


class Selected(nn.Module):
    """A torso over some leaves of the row's observation tree."""

    def __init__(self, keys: tuple[str, ...], torso: nn.Module):
        super().__init__()
        self.keys, self.torso, self.out_features = keys, torso, torso.out_features

    def forward(self, obs):
        return self.torso({k: obs[k] for k in self.keys})


class MAPPOPolicy(ActorCriticPolicy):
    """Acts for every agent at once: observations {obs (E, N, ...), comm_mask, active, global_state} in,
    actions (E, N, ...) out; its actor sees E * N rows of `ACTOR_KEYS` (and their masks). With a core, each
    env's state is (N, S, C): a row's state per agent (`state_shape`, (S, C), is one row's, as exported)."""

    def __init__(self, algo, worker_index: int, num_workers: int, seed: int):
        super().__init__(algo, worker_index, num_workers, seed)
        self.central, self._acting_space = algo.central, algo.row_space(algo.acting_keys)
        self.num_agents = algo.spec.num_agents
        # The critic's inputs are training-time only: acting runs the actor.
        self.acting_method = "actor_outputs" if self.state_shape is None else "actor_step"
        self.global_state = self.central == "state"
        self.time_limit = algo.cfg.time_limit
        self.episode_steps: np.ndarray | None = None  # (E,) steps each env's episode has taken, with a time limit

    @property
    def acting_space(self) -> spaces.Dict:
        return self._acting_space

    def acting_outputs(self) -> tuple[str, ...]:
        return ("out",) if self.box is None else ("out", "log_std")

    def initial_state(self, rows: int) -> np.ndarray | None:
        return None if self.state_shape is None else np.zeros((rows, self.num_agents, *self.state_shape), np.float32)

    def forward(self, obs, state):
        E, N = obs["active"].shape
        rows = tree.map(lambda x: x.reshape(E * N, *x.shape[2:]), agent_rows(stored_obs(obs["obs"]), 2))
        if state is None:
            out, after = self.run(self.acting_method, rows), None
        else:
            out, after = self.run(self.acting_method, rows, state.reshape(E * N, *state.shape[2:]))
            after = after.reshape(state.shape)
        return {k: v.reshape(E, N, *v.shape[1:]) for k, v in out.items()}, after

    def act(self, obs, explore: bool):
        outputs = self.infer(obs)
        E, N = obs["active"].shape
        rows = {k: v.reshape(E * N, *v.shape[2:]) for k, v in outputs.items() if k != "state"}
        actions, extras = self.rule.act(rows, self.rng, explore)
        extras = {k: v.reshape(E, N, *v.shape[1:]) for k, v in extras.items()}
        if "state" in outputs:
            extras["state"] = outputs["state"]
        if self.time_limit:
            if self.episode_steps is None or len(self.episode_steps) != E:
                self.episode_steps = np.zeros(E, np.int64)
            extras["episode_step"] = np.repeat(self.episode_steps[:, None], N, 1)
            self.episode_steps += 1
        return actions.reshape(E, N, *actions.shape[1:]), extras

    def episodes_ended(self, done: np.ndarray) -> None:
        if self.episode_steps is not None:
            self.episode_steps[done] = 0
        super().episodes_ended(done)

    def postprocess(self, traj: Trajectory) -> tuple[Batch, None]:
        """E envs' N agents as E * N columns of (T, E * N) arrays, with each agent's own episode ends,
        `live` (the agent was in its episode at the step) and, with a core, each column's state before the
        fragment's first step."""
        _, E, N = traj.rewards.shape
        ex = traj.extras
        columns = lambda x: x.reshape(x.shape[0], E * N, *x.shape[3:])  # noqa: E731 - (T, E, N, ...) -> (T, E * N, ...)
        active, next_active = ex["active"].astype(bool), ex["next_active"].astype(bool)
        env_ended = (traj.terminated | traj.truncated)[..., None]
        left = active & ~next_active & ~env_ended  # done by its own task while the others go on
        terminated = traj.terminated[..., None] | left | ~active
        truncated = traj.truncated[..., None] & next_active & ~terminated
        actions = ex.get("raw_action", traj.actions)

        def rows(obs, state):  # agent_rows as columns
            return tree.map(columns, agent_rows(stored_obs(obs), 3, self.central, state))

        items = {
            "obs": rows(traj.obs, ex.get("global_state")),
            "actions": columns(actions),
            "rewards": columns(traj.rewards.astype(np.float32, copy=False)),
            "terminated": columns(terminated),
            "truncated": columns(truncated),
            "next_obs": rows(traj.next_obs, ex.get("next_global_state")),
            "logp": columns(ex["logp"].astype(np.float32, copy=False)),
            "live": columns(active.astype(np.float32)),
        }
        if self.state_shape is not None:
            items["state"] = columns(ex["state"][:1])  # (1, E * N, S, C): time-major, as fragments join
        if self.time_limit:
            self.add_time(items, columns(ex["episode_step"]))
        return items, None

    def add_time(self, items: dict, step: np.ndarray) -> None:
        """The critic's time leaf of each row (`step`: (T, E * N), the episode's step at each row) and the
        end of an episode cut at the time limit: with the time left among V's inputs, that cut is the task's
        end, whose value is 0, not one to bootstrap over."""
        left = lambda s: np.clip(1.0 - s / self.time_limit, 0.0, 1.0).astype(np.float32)[..., None]  # noqa: E731
        items["obs"][TIME_KEY], items["next_obs"][TIME_KEY] = left(step), left(step + 1)
        out_of_time = items["truncated"] & (step + 1 >= self.time_limit)
        items["terminated"] = items["terminated"] | out_of_time
        items["truncated"] = items["truncated"] & ~out_of_time


class MAPPOLearner(PPOLearner):
    """PPO's learner; with `mappo.value_norm`, the value head's statistics follow each batch's returns and the
    value loss compares standardized values and returns."""

    def targets(self, t: dict[str, torch.Tensor]):
        adv, returns, est, lag = super().targets(t)
        if self.cfg.value_norm:
            self.net.v_head.update(returns, t.get("live"))
        return adv, returns, est, lag

    def value_units(self, values: torch.Tensor) -> torch.Tensor:
        """With value normalization, the value loss compares values standardized by the head's statistics."""
        return self.net.v_head.normalize(values) if self.cfg.value_norm else values


class MAPPO(PPO):
    name = "mappo"
    config = MAPPOConfig
    multi_agent = True
    external = False
    actions = ("discrete", "box")  # what the multi-agent adapter steps
    learner_cls, policy_cls = MAPPOLearner, MAPPOPolicy

    def check_config(self) -> str | None:
        if self.central == "state" and self.spec.state_space is None:
            return ("config key 'mappo.central_input': state needs an env with a global state (PettingZoo's "
                    "state_space and state()), which this env has not: use mappo.central_input=joint")
        image = image_leaf(self.own_space) if tree.is_structured(self.own_space) else None
        if self.central == "joint" and image is not None:
            return (f"config key 'mappo.central_input': joint concatenates the agents' vector leaves, and their "
                    f"observation's leaf {image!r} is an image: use mappo.central_input=state (the env's global "
                    "state) or mappo.critic=local")
        return None

    @property
    def masked(self) -> bool:
        return tree.has_mask(self.spec.observation_space)

    @property
    def own_space(self):
        """One agent's observation space without its action mask."""
        return without_mask(self.spec.observation_space)

    def row_space(self, keys: tuple[str, ...]) -> spaces.Dict:
        """The space of the leaves `keys` of a row's observation (`agent_rows`)."""
        own, n = self.own_space, self.spec.num_agents
        every = {"own": own, "agent": spaces.Discrete(n), "joint": joint_space(own, n), "state": self.spec.state_space,
                 TIME_KEY: spaces.Box(0.0, 1.0, (1,), np.float32)}
        if self.masked:
            every[tree.MASK_KEY] = self.spec.observation_space.spaces[tree.MASK_KEY]
        return spaces.Dict({k: every[k] for k in keys})

    def torso_spaces(self) -> list:
        return [self.row_space(ACTOR_KEYS), self.row_space(self.critic_keys)]

    @property
    def acting_keys(self) -> tuple[str, ...]:
        """What an agent's row holds when it acts: `ACTOR_KEYS` and its mask, where the env has one."""
        return ACTOR_KEYS + ((tree.MASK_KEY,) if self.masked else ())

    @property
    def central(self) -> str | None:
        """The central critic's own leaf of a row, `mappo.central_input` (joint or state); None for IPPO."""
        return self.cfg.central_input if self.cfg.critic == "central" else None

    @property
    def critic_keys(self) -> tuple[str, ...]:
        """What the value network reads: the central leaf or the agent's own observation, its index, and the
        time left where `mappo.time_limit` is set."""
        keys = (self.central, "agent") if self.central else ACTOR_KEYS
        return keys + ((TIME_KEY,) if self.cfg.time_limit else ())

    def build_network(self) -> ActorCriticNet:
        act = self.spec.action_space
        box, factors = isinstance(act, spaces.Box), action_factors(act)
        out_dim = int(np.prod(act.shape)) if box else int(factors.nvec.sum()) if factors else int(act.n)
        actor, critic = ACTOR_KEYS, self.critic_keys
        pi_torso = Selected(actor, make_torso(self.row_space(actor), self.model, self.image_torso))
        v_torso = Selected(critic, make_torso(self.row_space(critic), self.model, self.image_torso))
        core = RecurrentCore(self.model.core, pi_torso.out_features, self.model.core_size) if self.recurrent else None
        net = ActorCriticNet(pi_torso, v_torso, out_dim, box, factors, core)
        if self.cfg.value_norm:
            net.v_head = NormalizedValueHead(net.v_head)
        return net
