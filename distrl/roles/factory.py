"""Building a role's pieces from a config: the algorithm with the config parts it reads, a policy,
the envs, the learner's device."""
from __future__ import annotations

from distrl.core import Algorithm, EnvSpec
from distrl.envs import VectorEnv, env_spec
from distrl.registry import algorithm
from distrl.threads import one_compute_thread


def spec_of(env_cfg, multi_agent: bool, external=None) -> EnvSpec:
    """What the configured env gives one agent: the spaces a policy and a learner are built for; with
    `external` (the section) enabled, the spaces it declares stand in for env.id's."""
    if external is not None and external.enabled:
        return external_spec(env_cfg, external)
    if not multi_agent:
        return env_spec(env_cfg.id, env_cfg.kwargs, wrappers=env_cfg.wrappers, preset=env_cfg.preset,
                        normalize=env_cfg.normalize, obs_keys=env_cfg.obs_keys, action_mask=env_cfg.action_mask)
    from distrl.envs.multiagent import make_multiagent_env

    env = make_multiagent_env(env_cfg.id, env_cfg.kwargs, env_cfg.obs_keys, env_cfg.action_mask)
    try:
        return multiagent_spec(env)
    finally:
        env.close()


def multiagent_spec(env) -> EnvSpec:
    """A `MultiAgentEnv`'s spec: one agent's spaces, how many act, and the env's global state."""
    return EnvSpec(env.observation_space, env.action_space, env.num_agents, state_space=env.state_space)


def external_spec(env_cfg, external) -> EnvSpec:
    """External simulators' spaces: those the `external` section declares, env.id's for the others."""
    from distrl.envs.spaces import mask_problem, space_from_data

    declared = {side: space_from_data(getattr(external, f"{side}_space"), f"external.{side}_space",
                                      action=side == "action")
                for side in ("observation", "action") if getattr(external, f"{side}_space") is not None}
    if len(declared) < 2:
        spec = env_spec(env_cfg.id, env_cfg.kwargs, wrappers=env_cfg.wrappers, preset=env_cfg.preset,
                        obs_keys=env_cfg.obs_keys, action_mask=env_cfg.action_mask)
        declared = {"observation": spec.observation_space, "action": spec.action_space, **declared}
    problem = mask_problem(declared["observation"], declared["action"])
    if problem:
        raise ValueError(f"config key 'external.observation_space': {problem}")
    return EnvSpec(declared["observation"], declared["action"])


def make_vector_env(env_id: str, num_envs: int, seed: int, kwargs: dict | None, is_multi_agent: bool, *,
                    wrappers: list | None = None, preset: str = "none", training: bool = True, normalize=None,
                    statistics: dict | None = None, obs_keys: list | None = None, action_mask: str = "none",
                    global_state: bool = False):
    """The vector of envs a worker (`training`) or the evaluator steps (multi-agent ones for multi-agent
    algorithms, which take no wrappers, with the env's global state if `global_state`); `normalize`: the
    env.normalize section, `statistics` the policy's."""
    if is_multi_agent:
        from distrl.envs.multiagent_vector import MultiAgentVectorEnv

        return MultiAgentVectorEnv(env_id, num_envs, seed, kwargs, with_state=global_state, obs_keys=obs_keys,
                                   action_mask=action_mask)
    return VectorEnv(env_id, num_envs, seed, kwargs, wrappers=wrappers, preset=preset, training=training,
                     normalize=normalize, weights=statistics, obs_keys=obs_keys, action_mask=action_mask)


def make_rollout(cfg, policy, seed: int, worker_index: int):
    """A worker's rollout job: its policy stepping `env.num_envs` envs."""
    from distrl.roles.rollout import Rollout

    envs = make_vector_env(cfg.env.id, cfg.env.num_envs, seed, cfg.env.kwargs, algorithm(cfg.algo).multi_agent,
                           wrappers=cfg.env.wrappers, preset=cfg.env.preset, training=True,
                           normalize=cfg.env.normalize, obs_keys=cfg.env.obs_keys, action_mask=cfg.env.action_mask,
                           global_state=policy.global_state)
    return Rollout(policy, envs, cfg.rollout.fragment_length, worker_index, record=cfg.log.dataset is not None)


def make_algorithm(cfg, spec: EnvSpec | None = None) -> Algorithm:
    """The configured algorithm, holding the parts of the config it reads (`spec`: the env's, if known)."""
    cls = algorithm(cfg.algo)
    spec = spec or spec_of(cfg.env, cls.multi_agent, cfg.external)
    # What cuts experience into sequences: the sequence section for replay, rollout.recurrence on-policy.
    sequence = getattr(cfg, "sequence", None) if cls.data_path == "sequence" else cfg.rollout.recurrence
    return cls(spec, cfg.algo_config, cfg.model, cfg.seed, sequence)


def policy_seed(seed: int, worker_index: int) -> int:
    """Exploration seed of worker `worker_index` (-1: the evaluator or an inference server) of a run of `seed`."""
    return seed + 1000 + worker_index


def acting_policy(cfg, worker_index: int, num_workers: int):
    """The policy of worker `worker_index` of `num_workers`, on one compute thread."""
    one_compute_thread(load_torch=True)
    return make_algorithm(cfg).make_policy(worker_index, num_workers, policy_seed(cfg.seed, worker_index))


def trace_settings(log_cfg) -> tuple[bool, int]:
    """(whether to record a trace, events each process keeps) from the `log` section, as every role's
    tracer takes them."""
    return log_cfg.trace, log_cfg.trace_events


def resolve_device(device: str) -> str:
    """'auto' -> cuda when a GPU is visible, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
