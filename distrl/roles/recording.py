"""Playing a trained policy to record a dataset (`distrl record`): whole episodes of the evaluation env."""
from __future__ import annotations

import numpy as np

from distrl.core import Policy
from distrl.data.datasets import Episode
from distrl.data.recorder import EpisodeRecorder
from distrl import tree
from distrl.roles.evaluation import with_random_actions
from distrl.roles.factory import make_vector_env


def quotas(episodes: int, envs: int) -> np.ndarray:
    """Episodes each env records: equal shares, so short episodes are not favoured by finishing first."""
    return episodes // envs + (np.arange(envs) < episodes % envs)


def play_episodes(policy: Policy, env_cfg, episodes: int, seed: int, epsilon: float = 0.0,
                  explore: bool = False, max_envs: int = 16) -> list[Episode]:
    """`episodes` whole episodes of `policy` in the evaluation env (no training-only wrappers): greedy, or
    sampled with its own exploration (`explore`), each action replaced by a uniform random one with
    probability `epsilon`."""
    n = min(episodes, max_envs)
    envs = make_vector_env(env_cfg.id, n, seed, env_cfg.kwargs, False, wrappers=env_cfg.wrappers,
                           preset=env_cfg.preset, training=False, normalize=env_cfg.normalize,
                           statistics=policy.statistics, obs_keys=env_cfg.obs_keys, action_mask=env_cfg.action_mask)
    rng, want, out = np.random.default_rng(seed), quotas(episodes, n), []
    got = np.zeros(n, np.int64)
    recorder = EpisodeRecorder(envs.obs)
    policy.episodes_ended(np.ones(n, bool))
    try:
        while (got < want).any():
            actions, _ = policy.act(envs.obs, explore=explore)
            actions = with_random_actions(actions, epsilon, envs.action_space, rng, tree.mask_of(envs.obs))
            nxt, rewards, term, trunc, _ = envs.step(actions)
            policy.episodes_ended(term | trunc)
            ended = np.flatnonzero(term | trunc)
            for i, episode in zip(ended, recorder.step(actions, rewards, term, trunc, nxt, envs.obs)):
                if got[i] < want[i]:
                    out.append(episode)
                    got[i] += 1
    finally:
        envs.close()
    return out
