"""The replay's bytes per item, predicted from the spaces (the memory check's figure) and measured on stores."""
import numpy as np
from gymnasium import spaces

from distrl.replay import ReplayBuffer
from distrl.replay.frames import FrameEncoder
from distrl.replay.sequence_replay import SequenceReplay
from distrl.replay.sequences import SequenceAdder
from distrl.replay.sizing import flat_item_bytes, sequence_step_bytes, tree_bytes
from tests.replay.stacking import Runner, flat_transitions, make_envs

K = 4
FRAME = spaces.Box(0, 255, (K, 84, 84), np.uint8)


def _atari_runner(E: int, life: int) -> Runner:
    """84x84 frames, episodes of about `life` steps (Breakout's lives under random play)."""
    envs = make_envs(E, K, "reset", shape=(84, 84), max_steps=10**6, seed=1)
    for env in envs:
        env.unwrapped.p_end = 1.0 / life
    return Runner(envs, seed=1)


def _fill(buf: ReplayBuffer, runner: Runner, fragments: int, T: int) -> None:
    enc = FrameEncoder(K, 0)
    for _ in range(fragments):
        t = runner.rollout(T)
        msg, rows, _ = flat_transitions(enc, t, 0.99, 3)
        buf.add({**msg, "version": np.zeros(len(rows), np.int32)})


def test_the_memory_checks_flat_figure_is_what_the_store_allocates():
    cap = 300
    for stack in (K, 0):
        buf = ReplayBuffer(cap)
        runner = _atari_runner(2, 36)
        if stack:
            _fill(buf, runner, 3, 16)
        else:
            t = runner.rollout(4)
            buf.add({"obs": t.obs.reshape(-1, K, 84, 84), "actions": t.actions.reshape(-1),
                     "rewards": t.rewards.reshape(-1), "next_obs": t.next_obs.reshape(-1, K, 84, 84),
                     "discounts": t.rewards.reshape(-1), "version": np.zeros(t.rewards.size, np.int32)})
        allocated = buf.nbytes + 8 * cap + tree_bytes(cap) * cap  # + generations and the sum tree
        assert abs(allocated - cap * flat_item_bytes(FRAME, spaces.Discrete(4), cap, stack)) <= cap


def test_an_atari_transition_stores_in_less_than_8500_bytes_with_short_fragments():
    """Steady state (the ring full) with 16-step fragments and ~36-step episodes: about a frame per item."""
    buf = ReplayBuffer(1000)
    _fill(buf, _atari_runner(4, 36), 25, 16)
    assert 1000 * 0.9 < len(buf) <= 1000
    assert 84 * 84 < buf.bytes_per_item < 8_500


def test_sequence_replay_bytes_per_stored_step_with_frames_once():
    """R2D2's chunks of 8 steps hold 11 frames; short chunks at episode ends and items come on top."""
    E, chunk, L = 2, 8, 12
    adder = SequenceAdder(E, L, 4, 2, chunk, seed=0, frame_stack=K)
    buf = SequenceReplay(600, L)
    runner = _atari_runner(E, 200)
    for _ in range(30):
        t = runner.rollout(16)
        out = adder.add({"obs": t.obs, "actions": t.actions, "rewards": t.rewards}, {"obs": t.next_obs},
                        t.terminated, t.truncated, np.zeros((16, E, 1, 8), np.float32), 0)
        if out is not None:
            buf.add(out[0])
    predicted = sequence_step_bytes(FRAME, spaces.Discrete(4), chunk, K)
    assert predicted < buf.bytes_per_item < predicted * 1.25 < 84 * 84 * 4


def test_the_experience_server_reports_its_stores_bytes_per_item():
    from distrl.replay.fifo import FragmentQueue
    from distrl.replay.store import Take
    from distrl.roles.experience import ExperienceServer

    buf = ReplayBuffer(300)
    assert ExperienceServer(buf, Take()).bytes_per_item == 0.0
    _fill(buf, _atari_runner(2, 36), 2, 8)
    assert ExperienceServer(buf, Take()).bytes_per_item == buf.bytes_per_item > 84 * 84
    assert ExperienceServer(FragmentQueue(2), Take()).bytes_per_item is None
