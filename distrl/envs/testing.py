"""Environments for tests: faults (FlakyCartPole-v1, NaNCartPole-v1, HugeRewardCartPole-v1), one paced by
the clock (WaitingCartPole-v1) and two with a Dict observation (DictCartPole-v1, DictPendulum-v1). Use
as env.id "distrl.envs.testing:<name>". Two PettingZoo ParallelEnvs for MAPPO: MaskedAgents (action masks)
and CueMemory (memory), on TeamEnv (a test's own team env starts from it too)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control import CartPoleEnv, PendulumEnv
from pettingzoo.utils.env import ParallelEnv


class SeededFaults(CartPoleEnv):
    """Faults drawn from their own RNG: seeded by `seed` if given, else by the first seeded `reset`, so a
    run's faults follow its seed (and a config check's one step, at seed 0, is the same every time)."""

    def __init__(self, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self._fault_seed_fixed = seed is not None
        self._fault_rng = np.random.default_rng(seed)

    def reset(self, *, seed: int | None = None, options=None):
        if seed is not None and not self._fault_seed_fixed:
            self._fault_rng = np.random.default_rng(seed)
            self._fault_seed_fixed = True
        return super().reset(seed=seed, options=options)


class FlakyCartPole(SeededFaults):
    """CartPole whose step raises RuntimeError with probability `error_prob`."""

    def __init__(self, error_prob: float = 0.001, seed: int | None = None, **kwargs):
        super().__init__(seed, **kwargs)
        self.error_prob = error_prob

    def step(self, action):
        if self._fault_rng.random() < self.error_prob:
            raise RuntimeError("FlakyCartPole: injected env failure")
        return super().step(action)


if "FlakyCartPole-v1" not in gym.envs.registry:
    gym.register("FlakyCartPole-v1", entry_point=FlakyCartPole, max_episode_steps=500, reward_threshold=475.0)


class WaitingCartPole(CartPoleEnv):
    """CartPole whose step waits `step_s` seconds without the CPU, as an env waiting on a simulator or a
    robot does: a run of it is paced by the clock, and leaves the cores to other processes."""

    def __init__(self, step_s: float = 0.002, **kwargs):
        super().__init__(**kwargs)
        self.step_s = step_s

    def step(self, action):
        import time

        time.sleep(self.step_s)
        return super().step(action)


if "WaitingCartPole-v1" not in gym.envs.registry:
    gym.register("WaitingCartPole-v1", entry_point=WaitingCartPole, max_episode_steps=500, reward_threshold=475.0)


class NaNCartPole(SeededFaults):
    """CartPole whose observation or reward is NaN with probability `nan_prob` per step."""

    def __init__(self, nan_prob: float = 0.001, seed: int | None = None, **kwargs):
        super().__init__(seed, **kwargs)
        self.nan_prob = nan_prob

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self._fault_rng.random() < self.nan_prob:
            if self._fault_rng.random() < 0.5:
                obs = np.full_like(obs, np.nan)
            else:
                reward = float("nan")
        return obs, reward, terminated, truncated, info


class HugeRewardCartPole(SeededFaults):
    """CartPole paying a finite reward of 3e38 with probability `huge_prob`: squared or summed in float32
    it overflows to inf, so a learner's loss goes non-finite on any batch holding it."""

    def __init__(self, huge_prob: float = 0.001, seed: int | None = None, **kwargs):
        super().__init__(seed, **kwargs)
        self.huge_prob = huge_prob

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self._fault_rng.random() < self.huge_prob:
            reward = 3e38
        return obs, reward, terminated, truncated, info


for _name, _cls in (("NaNCartPole-v1", NaNCartPole), ("HugeRewardCartPole-v1", HugeRewardCartPole)):
    if _name not in gym.envs.registry:
        gym.register(_name, entry_point=_cls, max_episode_steps=500, reward_threshold=475.0)


class DictCartPole(CartPoleEnv):
    """CartPole whose observation is a Dict: the cart's position and velocity (`cart`) and the pole's angle
    and angular velocity (`pole`), two float leaves of very different scales, and the step count modulo
    256 (`clock`, uint8), a leaf that is not a float."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        cart, pole = np.split(self.observation_space.high, 2)  # CartPole's own bounds
        self.observation_space = spaces.Dict({
            "cart": spaces.Box(-cart, cart, dtype=np.float32), "pole": spaces.Box(-pole, pole, dtype=np.float32),
            "clock": spaces.Box(0, 255, (1,), np.uint8)})
        self.steps = 0

    def _dict(self, obs):
        return {"cart": obs[:2].astype(np.float32), "pole": obs[2:].astype(np.float32),
                "clock": np.array([self.steps % 256], np.uint8)}

    def reset(self, *, seed: int | None = None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.steps = 0
        return self._dict(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.steps += 1
        return self._dict(obs), reward, terminated, truncated, info


if "DictCartPole-v1" not in gym.envs.registry:
    gym.register("DictCartPole-v1", entry_point=DictCartPole, max_episode_steps=500, reward_threshold=475.0)


class DictPendulum(PendulumEnv):
    """Pendulum whose observation is a Dict: `angle` (cos, sin) and `velocity`, Pendulum's own vector in
    two leaves whose concatenation in key order is that vector."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        high = self.observation_space.high
        self.observation_space = spaces.Dict({"angle": spaces.Box(-high[:2], high[:2], dtype=np.float32),
                                              "velocity": spaces.Box(-high[2:], high[2:], dtype=np.float32)})

    def reset(self, *, seed: int | None = None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return {"angle": obs[:2], "velocity": obs[2:]}, info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return {"angle": obs[:2], "velocity": obs[2:]}, reward, terminated, truncated, info


if "DictPendulum-v1" not in gym.envs.registry:
    gym.register("DictPendulum-v1", entry_point=DictPendulum, max_episode_steps=200)


# --- multi-agent (PettingZoo ParallelEnvs, for MAPPO; env.id "distrl.envs.testing:<name>") ------------------
class TeamEnv(ParallelEnv):
    """`num_agents` agents (agent_0, agent_1, ...) for episodes of `length` steps: the names, the step `t`, and
    the generator `np_random` that a reset with a seed renews."""

    def __init__(self, num_agents: int, length: int):
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.agents: list[str] = []
        self.length = length
        self.np_random = np.random.default_rng()

    def _start(self, seed: int | None) -> None:
        """A reset's start: every agent in, at step 0 (`np_random` renewed from `seed` where one is given)."""
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0


class MaskedAgents(TeamEnv):
    """Each agent's step allows a random half of 6 actions: a legal action earns 1, an illegal one -100 and
    ends the episode for every agent, so a team that only acts masked returns exactly `length` per agent.
    The mask is each agent's Dict observation's `action_mask` key (PettingZoo classic's layout: `observation`
    and `action_mask`, an int8 Box), or with `mask_in: info` its `infos[agent]["action_mask"]` beside a Box
    observation. Agent i's observation has `sizes[i % len(sizes)]` entries (differing sizes: the adapter pads)."""

    metadata = {"name": "masked_agents_v0", "is_parallelizable": True}

    def __init__(self, num_agents: int = 2, length: int = 20, mask_in: str = "obs", sizes: list | None = None):
        super().__init__(num_agents, length)
        self.mask_in, self.sizes = mask_in, list(sizes or [3])

    def _size(self, agent: str) -> int:
        return self.sizes[self.possible_agents.index(agent) % len(self.sizes)]

    def observation_space(self, agent):
        box = spaces.Box(-1, 1, (self._size(agent),), np.float32)
        if self.mask_in == "info":
            return box
        return spaces.Dict({"observation": box, "action_mask": spaces.Box(0, 1, (6,), np.int8)})

    def action_space(self, agent):
        return spaces.Discrete(6)

    def _observe(self):
        self.masks = {a: np.zeros(6, np.int8) for a in self.agents}
        obs, infos = {}, {}
        for a in self.agents:
            self.masks[a][self.np_random.permutation(6)[:3]] = 1
            x = self.np_random.uniform(-1, 1, self._size(a)).astype(np.float32)
            obs[a] = x if self.mask_in == "info" else {"observation": x, "action_mask": self.masks[a].copy()}
            infos[a] = {"action_mask": self.masks[a].copy()} if self.mask_in == "info" else {}
        return obs, infos

    def reset(self, seed=None, options=None):
        self._start(seed)
        return self._observe()

    def step(self, actions):
        self.t += 1
        legal = {a: bool(self.masks[a][int(actions[a])]) for a in self.agents}
        rewards = {a: 1.0 if legal[a] else -100.0 for a in self.agents}
        over = not all(legal.values())
        term = {a: over for a in self.agents}
        trunc = {a: not over and self.t >= self.length for a in self.agents}
        obs, infos = self._observe()
        if over or self.t >= self.length:
            self.agents = []
        return obs, rewards, term, trunc, infos


class CueMemory(TeamEnv):
    """Memory for a team: each agent sees its own cue (one of 2) at the episode's first step only, then
    nothing but the time, and at the last of `length` steps earns 1 for the action matching its cue (0 for
    the other; every earlier step earns 0). An agent that remembers returns 1, one that cannot 0.5 at best."""

    metadata = {"name": "cue_memory_v0", "is_parallelizable": True}

    def __init__(self, num_agents: int = 2, length: int = 4):
        super().__init__(num_agents, length)

    def observation_space(self, agent):
        return spaces.Box(0, 1, (2 + self.length,), np.float32)  # the cue's one-hot, then the step's

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _observe(self):
        obs = {}
        for i, a in enumerate(self.agents):
            x = np.zeros(2 + self.length, np.float32)
            if self.t == 0:
                x[self.cues[i]] = 1.0
            x[2 + self.t] = 1.0
            obs[a] = x
        return obs

    def reset(self, seed=None, options=None):
        self._start(seed)
        self.cues = self.np_random.integers(0, 2, len(self.agents))
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        last = self.t == self.length - 1
        rewards = {a: float(last and int(actions[a]) == self.cues[i]) for i, a in enumerate(self.agents)}
        done, cut = {a: last for a in self.agents}, {a: False for a in self.agents}
        self.t = min(self.t + 1, self.length - 1)  # the final observation: the last step's again
        obs = self._observe()
        if last:
            self.agents = []
        return obs, rewards, done, cut, {}
