"""Action masks: a masked action is never taken, in training (every mode's acting path: a worker's own
network, central inference, A3C's workers; Ape-X's epsilon-greedy exploration) and in evaluation."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from distrl import train
from tests.run_files import episode_returns

LENGTH = 20


class RandomMask(gym.Env):
    """Each step allows a random half of 6 actions (the mask in the observation, as PettingZoo classic
    gives it); a legal action earns 1, an illegal one -100 and ends the episode: every episode of a policy
    that acts masked returns exactly LENGTH."""

    def __init__(self):
        self.observation_space = spaces.Dict({"x": spaces.Box(-1, 1, (3,), np.float32),
                                              "action_mask": spaces.MultiBinary(6)})
        self.action_space = spaces.Discrete(6)

    def _obs(self):
        self.mask = np.zeros(6, np.int8)
        self.mask[self.np_random.permutation(6)[:3]] = 1
        return {"x": self.np_random.uniform(-1, 1, 3).astype(np.float32), "action_mask": self.mask.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        if not self.mask[int(action)]:
            return self._obs(), -100.0, True, False, {}
        return self._obs(), 1.0, False, self.t >= LENGTH, {}


RUNS = [("ppo", "single", []), ("a2c", "single", []), ("impala", "single", []), ("a3c", "single", []),
        ("ppo", "async", ["rollout.inference=central"]),
        ("apex_dqn", "single", ["replay.min_size=256", "learner.batch_size=64", "apex_dqn.eps_end=0.5"]),
        # sequences of Dict observations, their masks stored per step for the targets' max (through the replay
        # server's actor: tests/algos/test_dhc_structured.py's masked team in async mode)
        ("r2d2", "single", ["replay.min_size=32", "learner.batch_size=16", "r2d2.eps_end=0.5", "sequence.burn_in=4",
                            "sequence.length=8", "sequence.period=4", "sequence.chunk_length=8"])]


@pytest.mark.parametrize("algo, mode, extra", RUNS, ids=[f"{a}-{m}" for a, m, _ in RUNS])
def test_no_masked_action_is_taken_in_training_or_evaluation(tmp_path, algo, mode, extra, request):
    if mode != "single":
        request.getfixturevalue("ray_session")
    run_dir = str(tmp_path / algo)
    summary = train(None, run_dir=run_dir, overrides=[
        f"algo={algo}", f"mode={mode}", "workers=2" if mode != "single" else "workers=1", "seed=3",
        f"env.id={__name__}:RandomMask", "env.num_envs=8", "rollout.fragment_length=16", "model.hidden=[16]",
        "eval.episodes=8", "eval.interval_s=0.3", "stop.max_env_steps=6000", "stop.max_seconds=60",
        "log.progress=false", "log.tensorboard=false", "fault.max_env_errors=0", *extra])
    assert summary["env_steps"] >= 6000 and summary["env_errors"] == 0, summary
    train_returns, eval_returns = episode_returns(run_dir)
    assert train_returns and eval_returns and summary["evaluations"] >= 1
    # A mean of LENGTH means no episode ended on a masked action (that one would return at most -99).
    assert set(train_returns) == {LENGTH} and set(eval_returns) == {LENGTH}, (train_returns, eval_returns)
