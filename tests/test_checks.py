"""distrl.checks, before a run: the replay memory check by the bytes the replay really stores per item."""
import numpy as np
import pytest
from gymnasium import spaces

from distrl.checks import _check_replay
from distrl.config import ConfigError, load_config
from distrl.core import EnvSpec

ATARI = spaces.Box(0, 255, (4, 84, 84), np.uint8)
GIB = 2**30


def _cfg(*extra):
    return load_config(None, ["replay.capacity=1000000", "env.id=ALE/Breakout-v5", *extra])


def test_an_atari_replay_of_a_million_frames_stored_once_fits_in_8_gib_not_in_6():
    framed = EnvSpec(ATARI, spaces.Discrete(4), frame_stack=4)
    _check_replay(_cfg(), framed, on_this_machine=True, memory=8 * GIB)  # ~7.1 KB per transition: 6.6 GiB
    with pytest.raises(ConfigError) as e:
        _check_replay(_cfg(), framed, on_this_machine=True, memory=6 * GIB)
    msg = str(e.value)
    assert msg.startswith("config key 'replay.capacity': 1000000 items need at least 6.6 GiB (") and "\n" not in msg
    per_item = int(msg.split("(")[1].split()[0])
    assert 84 * 84 < per_item <= 8_500


def test_stacks_stored_per_item_need_eight_times_more_and_are_refused():
    plain = EnvSpec(ATARI, spaces.Discrete(4), frame_stack=0)
    with pytest.raises(ConfigError, match=r"items need at least 52\.\d GiB \(5649\d bytes each"):
        _check_replay(_cfg(), plain, on_this_machine=True, memory=8 * GIB)
    _check_replay(_cfg(), plain, on_this_machine=False, memory=8 * GIB)  # a cluster node may have more


def test_sequence_replay_counts_a_chunks_first_stack_once_per_chunk():
    framed = EnvSpec(ATARI, spaces.Discrete(4), frame_stack=4)
    cfg = _cfg("algo=r2d2", "sequence.chunk_length=8")
    _check_replay(cfg, framed, on_this_machine=True, memory=10 * GIB)  # 7056 * 11 / 8 + fields: 9.1 GiB
    with pytest.raises(ConfigError, match=r"\(97\d\d bytes each"):
        _check_replay(cfg, framed, on_this_machine=True, memory=9 * GIB)


def test_eval_epsilon_is_refused_for_a_multi_agent_algorithm():
    import os

    from distrl.checks import validate
    from distrl.config import ConfigError, load_config

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with pytest.raises(ConfigError, match=r"^config key 'eval.epsilon': .*single-agent.*dhc"):
        validate(load_config(os.path.join(root, "configs", "dhc_mapf_8x8.yaml"), ["eval.epsilon=0.05"]))


@pytest.mark.parametrize("config, overrides, why", [
    ("dhc_mapf_8x8.yaml", [], "multi-agent envs are not normalized"),
    ("ppo_hopper.yaml", ["mode=async", "rollout.inference=central"], "central inference keeps"),
    ("cql_pendulum.yaml", ["data.dataset=/nonexistent-dataset-v0"], "offline run has no rollout workers"),
])
def test_normalization_is_refused_where_no_worker_gathers_its_statistics(config, overrides, why):
    import os

    from distrl.checks import _check_normalize
    from distrl.registry import algorithm

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config(os.path.join(root, "configs", config), [*overrides, "env.normalize.obs=true"])
    with pytest.raises(ConfigError, match=f"^config key 'env.normalize': .*{why}"):
        _check_normalize(cfg.env.normalize, algorithm(cfg.algo).multi_agent, bool(cfg.data.dataset),
                         cfg.rollout.inference)


@pytest.mark.parametrize("env_id, space", [("Blackjack-v1", "Tuple"), ("Taxi-v4", r"Discrete\(500\)")])
def test_normalizing_observations_that_are_not_a_float_box_is_one_line_naming_the_key(env_id, space):
    """Taxi's one-hot code was normalized as if it were a float vector, changing nothing useful; the line
    names the Discrete space under Taxi's mask."""
    from distrl.checks import validate

    with pytest.raises(ConfigError, match=rf"^config key 'env.normalize': env.normalize.obs normalizes float Box "
                                          rf"observations or a Dict's or Tuple's float Box leaves, the env has none: "
                                          rf"{space}"):
        validate(load_config(None, ["algo=ppo", "mode=single", f"env.id={env_id}", "env.normalize.obs=true"]))


MASKED_CUE = "tests.runtime.masked_cue:MaskedCue"  # a Dict observation with a nested Tuple and an action mask


@pytest.mark.parametrize("overrides, message", [
    (["algo=r2d2"], "'external.enabled': r2d2 cannot learn from external simulators: it acts with a recurrent state"),
    (["algo=a3c"], "a3c cannot learn from external simulators: its workers send gradients"),
    (["algo=bc", "data.dataset=nowhere"], "bc cannot learn from external simulators: it learns from a dataset only"),
    (["external.action_space={type: discrete, n: 3}"], "'external.action_space': Discrete(3) is not CartPole-v1's"),
    (["external.observation_space={type: box, shape: [5]}"], "'external.observation_space': Box("),
    (["external.observation_space={type: cube}"], "'external.observation_space.type': one of discrete, box, multi_discrete"),
    (["external.action_space={n: 0}"], "'external.action_space.n': a positive integer"),
    (["external.observation_space={shape: [4], low: [1, 2]}"], "'external.observation_space.low': a number or a list"),
    (["env.id=ALE/Pong-v5", "env.preset=atari"], "'env.id': ALE/Pong-v5 stacks frames"),
    (["external.action_space={type: dict, spaces: {a: {n: 2}}}"],
     "'external.action_space.type': one of discrete, box, multi_discrete, multi_binary, got 'dict'"),
    (["external.observation_space={type: tuple, spaces: [{n: 2}, {type: multi_binary, n: 0}]}"],
     "'external.observation_space.spaces.1.n': a positive integer"),
    ([f"env.id={MASKED_CUE}", "external.observation_space={type: dict, spaces: {cue: {n: 4}, action_mask: "
      "{type: multi_binary, n: 4}}}"], "'external.observation_space': its 'action_mask' leaf is MultiBinary(4), where "
                                       "Discrete(5) actions take a multi_binary of 5"),
    ([f"env.id={MASKED_CUE}", "external.observation_space={type: dict, spaces: {cue: {n: 4}, action_mask: "
      "{type: multi_binary, n: 5}}}"], "'external.observation_space': Dict('action_mask': MultiBinary(5), 'cue': "
                                       "Discrete(4)) is not tests.runtime.masked_cue:MaskedCue's"),
    (["external.host=192.0.2.1"], "'external.host': the simulator server cannot listen on 192.0.2.1:0"),
])
def test_an_external_section_that_cannot_run_is_one_line_naming_its_key(overrides, message):
    from distrl.checks import validate

    with pytest.raises(ConfigError) as e:
        validate(load_config(None, ["external.enabled=true", "mode=single", *overrides]))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_declared_spaces_equal_to_the_envs_pass():
    from distrl.checks import validate

    validate(load_config(None, ["external.enabled=true", "mode=single", f"env.id={MASKED_CUE}",
                                "external.observation_space={type: dict, spaces: {cue: {n: 4}, action_mask: {type: "
                                "multi_binary, n: 5}, noise: {type: tuple, spaces: [{shape: [2], low: -1, high: 1}, "
                                "{type: multi_binary, n: 2}]}}}", "external.action_space={n: 5}"]))

    validate(load_config(None, ["external.enabled=true", "mode=single", "external.action_space={type: discrete, n: 2}",
                                "external.observation_space={type: box, shape: [4]}"]))  # its bounds: no input
    validate(load_config(None, ["external.enabled=true", "mode=single", "algo=sac", "env.id=Pendulum-v1",
                                "external.action_space={type: box, shape: [1], low: -2, high: 2}"]))
    with pytest.raises(ConfigError, match="'external.action_space'"):  # an action's bounds scale the actions
        validate(load_config(None, ["external.enabled=true", "mode=single", "algo=sac", "env.id=Pendulum-v1",
                                    "external.action_space={type: box, shape: [1], low: -1, high: 1}"]))
