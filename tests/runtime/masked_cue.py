"""MaskedCue: a Dict observation with a nested Tuple and an action mask, which a policy must learn from and
whose mask it must obey. Gymnasium only: a simulator process (`bench.external_sim`) steps it as the run's
evaluator does (`env.id=tests.runtime.masked_cue:MaskedCue`)."""
import gymnasium as gym
import numpy as np
from gymnasium import spaces

LENGTH = 8
TRAP = 4  # the action worth most, which the mask never allows


class MaskedCue(gym.Env):
    """Each step shows a cue (`cue`, Discrete 4) beside noise (`noise`: a Box and a MultiBinary in a Tuple);
    the mask allows the cue's own action (reward 1), each of the other three with probability 1/2 (reward 0),
    and never action 4, a trap worth 2 that only a policy ignoring the mask would learn to take. Episodes of
    LENGTH steps: a policy that learned the cues returns LENGTH, one acting at random among the legal actions
    3.75 on average."""

    def __init__(self):
        self.observation_space = spaces.Dict({
            "cue": spaces.Discrete(4),
            "noise": spaces.Tuple([spaces.Box(-1, 1, (2,), np.float32), spaces.MultiBinary(2)]),
            "action_mask": spaces.MultiBinary(5)})
        self.action_space = spaces.Discrete(5)

    def _obs(self):
        self.cue = int(self.np_random.integers(0, 4))
        mask = np.zeros(5, np.int8)
        mask[:4] = self.np_random.random(4) < 0.5
        mask[self.cue], mask[TRAP] = 1, 0
        noise = (self.np_random.uniform(-1, 1, 2).astype(np.float32), self.np_random.integers(0, 2, 2).astype(np.int8))
        return {"cue": self.cue, "noise": noise, "action_mask": mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = 2.0 if int(action) == TRAP else float(int(action) == self.cue)
        return self._obs(), reward, False, self.t >= LENGTH, {}
