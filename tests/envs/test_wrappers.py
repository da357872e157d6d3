"""`env.wrappers`: gymnasium wrappers by name or module:Class, with kwargs, train-only ones left out of
evaluation envs, and every mistake one line naming `env.wrappers[i]`."""
import gymnasium as gym
import numpy as np
import pytest

from distrl.envs import EnvError, VectorEnv, check_env, env_spec, make_env
from distrl.envs.wrappers import parse_wrappers

HERE = "tests.envs.test_wrappers"


class ScaleReward(gym.RewardWrapper):
    """Rewards times `factor` (a wrapper of the user's own, named as module:Class)."""

    def __init__(self, env, factor: float = 10.0):
        super().__init__(env)
        self.factor = factor

    def reward(self, reward):
        return self.factor * reward


class FailsOnStep(gym.Wrapper):
    def step(self, action):
        raise RuntimeError("this wrapper is broken")


class HalfObservation(gym.ObservationWrapper):
    """Keeps the first two entries of a CartPole observation (changes the observation space)."""

    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def observation(self, obs):
        return obs[:2]


def chain(env: gym.Env) -> list[str]:
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


def test_wrappers_by_name_and_module_class_apply_in_order_with_their_kwargs():
    env = make_env("CartPole-v1", wrappers=[{"TimeLimit": {"max_episode_steps": 5}}, f"{HERE}:ScaleReward",
                                            {"FrameStackObservation": {"stack_size": 3}}])
    names = chain(env)
    assert names.index("FrameStackObservation") < names.index("ScaleReward") < names.index("TimeLimit")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 4)
    rewards, steps, done = [], 0, False
    while not done:
        obs, r, te, tr, _ = env.step(0)
        rewards.append(r)
        steps += 1
        done = te or tr
    assert set(rewards) == {10.0} and steps <= 5


def test_train_only_wrappers_are_in_training_envs_and_not_in_evaluation_envs():
    wrappers = [{f"{HERE}:ScaleReward": {"factor": 3.0}, "train_only": True}]
    training = VectorEnv("CartPole-v1", 2, 0, wrappers=wrappers, training=True)
    evaluation = VectorEnv("CartPole-v1", 2, 0, wrappers=wrappers, training=False)
    actions = np.zeros(2, np.int64)
    assert training.step(actions)[1].tolist() == [3.0, 3.0]
    assert evaluation.step(actions)[1].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("wrappers, message", [
    (["FrameStack"], r"env.wrappers\[0\]': unknown gymnasium wrapper 'FrameStack' \(did you mean FrameStackObservation"),
    (["TimeLimit", {"TimeLimit": {"steps": 3}}], r"env.wrappers\[0\]': TimeLimit: missing a required argument"),
    (["RecordEpisodeStatistics", {"TimeLimit": {"max_episode_steps": 3, "steps": 3}}],
     r"env.wrappers\[1\]': TimeLimit: got an unexpected keyword"),
    ([{"FrameStackObservation": {"stack_size": 0}}], r"env.wrappers\[0\]': FrameStackObservation\(stack_size=0\) fails"),
    (["no_such_module_xyz:Wrap"], r"env.wrappers\[0\]': cannot import 'no_such_module_xyz'"),
    (["os.path:join"], r"env.wrappers\[0\]': 'os.path:join' is not a gymnasium.Wrapper class"),
    ([{"ClipReward": {}, "TimeLimit": {}}], r"env.wrappers\[0\]': expected exactly one wrapper name"),
    ([{"ClipReward": {}, "train_only": "yes"}], r"env.wrappers\[0\].train_only': expected true or false"),
    ([{"ClipReward": [1, 2]}], r"env.wrappers\[0\]': the kwargs of ClipReward must be a mapping"),
    ([3], r"env.wrappers\[0\]': expected a wrapper name"),
    ("ClipReward", r"env.wrappers': expected a list"),
])
def test_a_bad_wrapper_is_one_line_naming_its_index(wrappers, message):
    with pytest.raises(EnvError, match=message) as e:
        make_env("CartPole-v1", wrappers=wrappers)
    assert "\n" not in str(e.value)


def test_a_wrapper_that_raises_on_step_is_named_by_the_env_check():
    with pytest.raises(EnvError, match=r"^config key 'env.wrappers\[1\]': .*this wrapper is broken$"):
        check_env("CartPole-v1", wrappers=["RecordEpisodeStatistics", f"{HERE}:FailsOnStep"])


def test_a_train_only_wrapper_may_not_change_the_spaces_the_evaluator_sees():
    with pytest.raises(EnvError, match="env.wrappers': a train_only wrapper changes the observation"):
        check_env("CartPole-v1", wrappers=[{f"{HERE}:HalfObservation": None, "train_only": True}])


def test_frame_stack_is_the_stack_size_when_the_last_observation_change_is_a_frame_stack():
    stack = {"FrameStackObservation": {"stack_size": 3}}
    assert env_spec("CartPole-v1").frame_stack == 0
    assert check_env("CartPole-v1", wrappers=[stack, "RecordEpisodeStatistics"]).frame_stack == 3
    assert env_spec("CartPole-v1", wrappers=[stack, {"TimeLimit": {"max_episode_steps": 9}}]).frame_stack == 3
    # something after the stack that changes the observations: they are no longer stacks of frames
    assert env_spec("CartPole-v1", wrappers=[stack, "FlattenObservation"]).frame_stack == 0


def test_bare_names_and_null_kwargs_parse_to_no_kwargs():
    specs = parse_wrappers(["ClipReward", {"RecordEpisodeStatistics": None}])
    assert [(s.cls.__name__, s.kwargs, s.train_only) for s in specs] == [
        ("ClipReward", {}, False), ("RecordEpisodeStatistics", {}, False)]
    assert parse_wrappers(None) == [] and parse_wrappers([]) == []
