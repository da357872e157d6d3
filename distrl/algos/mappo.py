"""MAPPO (Yu et al., 2022) and IPPO: PPO with one set of weights acting for every agent of a multi-agent env.

Agents are rows of the batch: a worker's E envs of N agents act as E * N rows, and a fragment stores them
as E * N columns of the time-major (T, B) layout PPO's learner takes, so GAE, V-trace, the clipped
surrogate and the minibatches are PPO's own (`distrl.algos.ppo`). What is multi-agent is what a row holds
and which rows count:

- a row's observation is a tree: `own` (the agent's observation) and `agent` (its index, one-hot encoded by
  the torso: parameter sharing can still tell agents apart), all the actor reads (`ACTOR_KEYS`), and, for
  the central critic, `joint` (every agent's observation, concatenated) or `state` (the env's global state,
  `MAStep.state`), by `mappo.central_input`: the critic's input at training time only;
- `mappo.critic: central` (MAPPO) has the value network read that leaf and `agent`, `local` (IPPO) `own`
  and `agent`;
- an agent that left its episode early (PettingZoo: terminated while others go on) ends there, as its own
  column's termination; the rows of agents no longer in the episode are kept out of the losses and of the
  advantages' normalization (`live`);
- rewards, returns and advantages are per agent; an episode's truncation bootstraps every agent still in it.

Acting runs the actor alone (`ActorCriticNet.actor_outputs`) on each agent's row, which is also what
`distrl export` writes: one agent's actor, inputs `agent` and `own`.

The env goes through the multi-agent adapter DHC uses (`distrl.envs.multiagent`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gymnasium import spaces
from torch import nn

from distrl import tree
from distrl.algos.actor_critic import ActorCriticNet, action_factors
from distrl.algos.actor_critic_acting import ActorCriticPolicy
from distrl.algos.common import stored_obs
from distrl.algos.ppo import PPO, PPOConfig
from distrl.config.fields import f
from distrl.config.sections import ModelConfig
from distrl.core import Batch, EnvSpec, Trajectory
from distrl.models import make_torso


ACTOR_KEYS = ("own", "agent")  # what an agent has when it acts on its own (and all an exported actor takes)


@dataclass
class MAPPOConfig(PPOConfig):
    critic: str = f("central", "the value network's input: central (MAPPO: mappo.central_input, and the agent's "
                    "index) | local (IPPO: the agent's own observation and index)", choices=("central", "local"))
    central_input: str = f("joint", "what the central critic reads: joint (every agent's observation, "
                           "concatenated) | state (the env's global state, PettingZoo's state())",
                           choices=("joint", "state"))


def agent_rows(obs: np.ndarray, rank: int, central: str | None = None,
               state: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-agent rows of observations (..., N, *obs_shape) (`rank`: len(obs_shape)): the tree each agent's
    row holds (module docstring), with the same leading (..., N) axes; `central`: the central critic's leaf,
    joint or state (the global state (..., *state_shape), given as `state`), or None."""
    lead = obs.shape[:obs.ndim - rank]
    rows = {"own": obs, "agent": np.broadcast_to(np.arange(lead[-1], dtype=np.int64), lead).copy()}
    if central is not None:
        # Every agent's row of an env holds the same joint observation or state.
        whole = obs.reshape(*lead[:-1], 1, -1) if central == "joint" else np.expand_dims(state, len(lead) - 1)
        rows[central] = np.broadcast_to(whole, (*lead, *whole.shape[len(lead):])).copy()
    return rows


class Selected(nn.Module):
    """A torso over some leaves of the row's observation tree."""

    def __init__(self, keys: tuple[str, ...], torso: nn.Module):
        super().__init__()
        self.keys, self.torso, self.out_features = keys, torso, torso.out_features

    def forward(self, obs):
        return self.torso({k: obs[k] for k in self.keys})


class MAPPOPolicy(ActorCriticPolicy):
    """Acts for every agent at once: observations {obs (E, N, ...), comm_mask, active, global_state} in,
    actions (E, N, ...) out; its actor sees E * N rows of `ACTOR_KEYS`."""

    def __init__(self, algo, worker_index: int, num_workers: int, seed: int):
        super().__init__(algo, worker_index, num_workers, seed)
        self.central, self._acting_space = algo.central, algo.row_space(ACTOR_KEYS)
        self.rank = len(algo.spec.observation_space.shape)
        self.acting_method = "actor_outputs"  # the critic's inputs are training-time only
        self.global_state = self.central == "state"

    @property
    def acting_space(self) -> spaces.Dict:
        return self._acting_space

    def acting_outputs(self) -> tuple[str, ...]:
        return ("out",) if self.box is None else ("out", "log_std")

    def forward(self, obs, state):
        agents = obs["obs"]  # (E, N, ...)
        lead = agents.shape[:2]
        rows = tree.map(lambda x: x.reshape(-1, *x.shape[2:]), agent_rows(stored_obs(agents), self.rank))
        out = self.run(self.acting_method, rows)
        return {k: v.reshape(*lead, *v.shape[1:]) for k, v in out.items()}, None

    def act(self, obs, explore: bool):
        outputs = self.infer(obs)
        lead = obs["obs"].shape[:2]
        actions, extras = self.rule.act({k: v.reshape(-1, *v.shape[2:]) for k, v in outputs.items()}, self.rng, explore)
        return actions.reshape(*lead, *actions.shape[1:]), {k: v.reshape(*lead, *v.shape[1:]) for k, v in extras.items()}

    def postprocess(self, traj: Trajectory) -> tuple[Batch, None]:
        """E envs' N agents as E * N columns of (T, E * N) arrays, with each agent's own episode ends and
        `live`: the agent was in its episode at the step."""
        T, E, N = traj.rewards.shape
        ex = traj.extras
        columns = lambda x: x.reshape(T, E * N, *x.shape[3:])  # noqa: E731 - (T, E, N, ...) -> (T, E * N, ...)
        active, next_active = ex["active"].astype(bool), ex["next_active"].astype(bool)
        env_ended = (traj.terminated | traj.truncated)[..., None]
        left = active & ~next_active & ~env_ended  # done by its own task while the others go on
        terminated = traj.terminated[..., None] | left | ~active
        truncated = traj.truncated[..., None] & next_active & ~terminated
        actions = ex.get("raw_action", traj.actions)

        def rows(obs, state):  # agent_rows as columns
            return tree.map(columns, agent_rows(stored_obs(obs), self.rank, self.central, state))

        return {
            "obs": rows(traj.obs, ex.get("global_state")),
            "actions": columns(actions),
            "rewards": columns(traj.rewards.astype(np.float32, copy=False)),
            "terminated": columns(terminated),
            "truncated": columns(truncated),
            "next_obs": rows(traj.next_obs, ex.get("next_global_state")),
            "logp": columns(ex["logp"].astype(np.float32, copy=False)),
            "live": columns(active.astype(np.float32)),
        }, None


class MAPPO(PPO):
    name = "mappo"
    config = MAPPOConfig
    model_config = ModelConfig
    multi_agent = True
    external = False
    actions = ("discrete", "box")  # what the multi-agent adapter steps
    structured_obs = False   # one Box per agent (the adapter pads them to one shape)
    policy_cls = MAPPOPolicy

    @classmethod
    def check_spec(cls, spec: EnvSpec) -> str | None:
        if not isinstance(spec.observation_space, spaces.Box):
            return f"mappo needs a Box observation per agent, the env has {spec.observation_space}"
        return super().check_spec(spec)

    def check_config(self) -> str | None:
        if self.central == "state" and self.spec.state_space is None:
            return ("config key 'mappo.central_input': state needs an env with a global state (PettingZoo's "
                    "state_space and state()), which this env has not: use mappo.central_input=joint")
        return None

    def row_space(self, keys: tuple[str, ...]) -> spaces.Dict:
        """The space of the leaves `keys` of a row's observation (`agent_rows`)."""
        obs, n = self.spec.observation_space, self.spec.num_agents
        joint = spaces.Box(np.tile(obs.low.reshape(-1), n), np.tile(obs.high.reshape(-1), n), dtype=obs.dtype)
        every = {"own": obs, "agent": spaces.Discrete(n), "joint": joint, "state": self.spec.state_space}
        return spaces.Dict({k: every[k] for k in keys})

    def torso_spaces(self) -> list:
        return [self.row_space(ACTOR_KEYS), self.row_space(self.critic_keys)]

    @property
    def central(self) -> str | None:
        """The central critic's own leaf of a row, `mappo.central_input` (joint or state); None for IPPO."""
        return self.cfg.central_input if self.cfg.critic == "central" else None

    @property
    def critic_keys(self) -> tuple[str, ...]:
        return (self.central, "agent") if self.central else ACTOR_KEYS

    @property
    def recurrent(self) -> bool:
        return False

    def build_network(self) -> ActorCriticNet:
        act = self.spec.action_space
        box, factors = isinstance(act, spaces.Box), action_factors(act)
        out_dim = int(np.prod(act.shape)) if box else int(factors.nvec.sum()) if factors else int(act.n)
        actor, critic = ACTOR_KEYS, self.critic_keys
        pi_torso = Selected(actor, make_torso(self.row_space(actor), self.model, self.image_torso))
        v_torso = Selected(critic, make_torso(self.row_space(critic), self.model, self.image_torso))
        return ActorCriticNet(pi_torso, v_torso, out_dim, box, factors)
