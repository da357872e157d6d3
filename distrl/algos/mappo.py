"""MAPPO (Yu et al., 2022) and IPPO: PPO with one set of weights acting for every agent of a multi-agent env.

Agents are rows of the batch: a worker's E envs of N agents act as E * N rows, and a fragment stores them
as E * N columns of the time-major (T, B) layout PPO's learner takes, so GAE, V-trace, the clipped
surrogate and the minibatches are PPO's own (`distrl.algos.ppo`). What is multi-agent is what a row holds
and which rows count:

- a row's observation is a tree: `own` (the agent's observation), `agent` (its index, one-hot encoded by the
  torso: parameter sharing can still tell agents apart) and, for the central critic, `joint` (every agent's
  observation, concatenated: the critic's input at training time only; the actor never reads it);
- `mappo.critic: central` (MAPPO) has the value network read `joint` and `agent`, `local` (IPPO) `own` and
  `agent`;
- an agent that left its episode early (PettingZoo: terminated while others go on) ends there, as its own
  column's termination; the rows of agents no longer in the episode are kept out of the losses and of the
  advantages' normalization (`live`);
- rewards, returns and advantages are per agent; an episode's truncation bootstraps every agent still in it.

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


@dataclass
class MAPPOConfig(PPOConfig):
    critic: str = f("central", "the value network's input: central (MAPPO: every agent's observation, and the agent's "
                    "index) | local (IPPO: the agent's own observation and index)", choices=("central", "local"))


def agent_rows(obs: np.ndarray, rank: int, joint: bool) -> dict[str, np.ndarray]:
    """Per-agent rows of observations (..., N, *obs_shape) (`rank`: len(obs_shape)): the tree each agent's
    row holds (module docstring), with the same leading (..., N) axes."""
    lead = obs.shape[:obs.ndim - rank]
    rows = {"own": obs, "agent": np.broadcast_to(np.arange(lead[-1], dtype=np.int64), lead).copy()}
    if joint:
        flat = obs.reshape(*lead[:-1], 1, -1)
        rows["joint"] = np.broadcast_to(flat, (*lead, flat.shape[-1])).copy()
    return rows


class Selected(nn.Module):
    """A torso over some leaves of the row's observation tree."""

    def __init__(self, keys: tuple[str, ...], torso: nn.Module):
        super().__init__()
        self.keys, self.torso, self.out_features = keys, torso, torso.out_features

    def forward(self, obs):
        return self.torso({k: obs[k] for k in self.keys})


class MAPPOPolicy(ActorCriticPolicy):
    """Acts for every agent at once: observations {obs (E, N, ...), comm_mask, active} in, actions (E, N, ...)
    out; its network sees E * N rows."""

    def __init__(self, algo, worker_index: int, num_workers: int, seed: int):
        super().__init__(algo, worker_index, num_workers, seed)
        self.joint = algo.cfg.critic == "central"
        self.rank = len(algo.spec.observation_space.shape)

    def forward(self, obs, state):
        agents = obs["obs"]  # (E, N, ...)
        lead = agents.shape[:2]
        rows = tree.map(lambda x: x.reshape(-1, *x.shape[2:]), agent_rows(stored_obs(agents), self.rank, self.joint))
        out = self.run("act_outputs", rows)
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
        return {
            "obs": tree.map(columns, agent_rows(stored_obs(traj.obs), self.rank, self.joint)),
            "actions": columns(actions),
            "rewards": columns(traj.rewards.astype(np.float32, copy=False)),
            "terminated": columns(terminated),
            "truncated": columns(truncated),
            "next_obs": tree.map(columns, agent_rows(stored_obs(traj.next_obs), self.rank, self.joint)),
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

    def row_space(self, keys: tuple[str, ...]) -> spaces.Dict:
        """The space of the leaves `keys` of a row's observation (`agent_rows`)."""
        obs, n = self.spec.observation_space, self.spec.num_agents
        joint = spaces.Box(np.tile(obs.low.reshape(-1), n), np.tile(obs.high.reshape(-1), n), dtype=obs.dtype)
        every = {"own": obs, "agent": spaces.Discrete(n), "joint": joint}
        return spaces.Dict({k: every[k] for k in keys})

    def torso_spaces(self) -> list:
        return [self.row_space(("own", "agent")), self.row_space(self.critic_keys)]

    @property
    def critic_keys(self) -> tuple[str, ...]:
        return ("joint", "agent") if self.cfg.critic == "central" else ("own", "agent")

    @property
    def recurrent(self) -> bool:
        return False

    def build_network(self) -> ActorCriticNet:
        act = self.spec.action_space
        box, factors = isinstance(act, spaces.Box), action_factors(act)
        out_dim = int(np.prod(act.shape)) if box else int(factors.nvec.sum()) if factors else int(act.n)
        actor, critic = ("own", "agent"), self.critic_keys
        pi_torso = Selected(actor, make_torso(self.row_space(actor), self.model, self.image_torso))
        v_torso = Selected(critic, make_torso(self.row_space(critic), self.model, self.image_torso))
        return ActorCriticNet(pi_torso, v_torso, out_dim, box, factors)
