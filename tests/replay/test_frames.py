"""Frames stored once in flat replay: the encoder, the frame ring, and ReplayBuffer over framed messages."""
import numpy as np
import pytest

from distrl.replay import ReplayBuffer
from distrl.replay.frames import FRAMES, KINDS, NEXT_REF, OBS_REF, FrameEncoder, local_links, stack_indices, take_stacks
from distrl.replay.nstep import nstep_transitions
from distrl.replay.store import digest
from tests.replay.stacking import Runner, flat_transitions, make_envs, reloaded_alike

K, GAMMA, N = 4, 0.9, 3


def _decode(msg: dict, refs: np.ndarray) -> np.ndarray:
    return take_stacks(msg[FRAMES], stack_indices(local_links(msg[KINDS]), refs, K))


def _naive(traj) -> dict:
    return nstep_transitions(traj.obs, traj.actions, traj.rewards, traj.terminated, traj.truncated,
                             traj.next_obs, GAMMA, N)


class Feed:
    """Fragments of stacked envs into a buffer, with the naive transitions by item id (insertion order)."""

    def __init__(self, buf: ReplayBuffer, padding: str, E: int = 3, shape=(3, 4), seed: int = 0):
        self.buf, self.runner = buf, Runner(make_envs(E, K, padding, shape, seed=seed), seed=seed)
        self.encoder, self.naive, self.items = FrameEncoder(K, seed), {}, 0
        self.rng = np.random.default_rng(seed)

    def fragment(self, T: int) -> None:
        self.buf.add(*self.message(T))

    def message(self, T: int) -> tuple[dict, np.ndarray]:
        """The next fragment's framed message (items tagged "uid") and priorities."""
        traj = self.runner.rollout(T)
        msg, rows, _ = flat_transitions(self.encoder, traj, GAMMA, N)
        ref = _naive(traj)
        ids = self.items + np.arange(len(rows))
        self.items += len(rows)
        self.naive.update({int(i): {k: ref[k][r] for k in ("obs", "next_obs", "actions", "rewards", "discounts")}
                           for i, r in zip(ids, rows)})
        return {**msg, "uid": ids}, self.rng.random(len(ids)) + 0.1

    def check(self, batch: dict) -> None:
        """Every sampled item equals, bit for bit, the naive transition it was made from; only the newest live."""
        uid = batch["uid"].ravel()
        assert uid.min() >= self.items - len(self.buf), "only the newest len(buf) items are sampled (FIFO)"
        for name in ("obs", "next_obs", "actions", "rewards", "discounts"):
            got = batch[name].reshape(len(uid), *batch[name].shape[2:])
            want = np.stack([self.naive[int(u)][name] for u in uid])
            assert got.dtype == want.dtype and np.array_equal(got, want), name


@pytest.mark.parametrize("padding", ["reset", "zero"])
@pytest.mark.parametrize("T", [1, 2, 7])
def test_encoded_fragments_rebuild_every_stack_bit_for_bit(padding, T):
    """Within one message: every item's obs and n-step next_obs stack, incl. episode starts, truncations, stills."""
    runner, enc = Runner(make_envs(3, K, padding, seed=T), seed=T), FrameEncoder(K, 0)
    for _ in range(12):
        traj = runner.rollout(T)
        msg, rows, boot = flat_transitions(enc, traj, GAMMA, N)
        ref = _naive(traj)
        np.testing.assert_array_equal(_decode(msg, msg[OBS_REF]), ref["obs"][rows])
        np.testing.assert_array_equal(_decode(msg, msg[NEXT_REF]), ref["next_obs"][rows])
        np.testing.assert_array_equal(msg["discounts"], ref["discounts"][rows])
        assert np.array_equal(traj.next_obs.reshape(-1, K, 3, 4)[boot], ref["next_obs"][rows])
        assert len(msg[FRAMES]) < 2 * K * rows.size, "not whole stacks per item"


def test_discontinuities_and_padding_patterns_are_rebuilt_exactly():
    """Stacks that do not shift, all-zero and repeated frames, floats with -0.0: each rebuilt bit for bit."""
    rng = np.random.default_rng(0)
    T, E = 6, 2
    frames = rng.integers(0, 3, (40, 2)).astype(np.float32)
    frames[::5] = -0.0
    pick = rng.integers(0, 40, (T, E, K))
    obs, next_obs = frames[pick], frames[rng.integers(0, 40, (T, E, K))]
    next_obs[::2, :, :-1] = obs[::2, :, 1:]  # some steps continue, the others jump
    joined = rng.random((T - 1, E)) < 0.5
    obs[1:][joined] = next_obs[:-1][joined]
    done = rng.random((T, E)) < 0.3
    msg, obs_ref, next_ref = FrameEncoder(K).encode(obs, next_obs, done)
    for got, want in ((_decode(msg, obs_ref), obs), (_decode(msg, next_ref), next_obs)):
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("padding", ["reset", "zero"])
@pytest.mark.parametrize("prioritized", [True, False])
def test_sampled_batches_equal_naive_stacking_through_eviction(padding, prioritized):
    """Many fragments through a small replay: frames are overwritten and their items evicted first; every
    sampled stack is still the one the env emitted, priorities update, the newest items stay."""
    buf = ReplayBuffer(120, prioritized=prioritized, seed=1)
    feed = Feed(buf, padding)
    for i in range(40):
        feed.fragment(T=[1, 5, 7][i % 3])
        batch, idx, _ = buf.sample_many(2, 32)
        feed.check(batch)
        assert {"obs", "next_obs"} <= set(batch) and OBS_REF not in batch
        buf.update_priorities(idx, feed.rng.random(idx.shape), batch["_generation"])
        assert len(buf) <= 120
    assert len(buf) > 60, "eviction follows the frames, not much sooner"


def test_prioritized_sampling_follows_priorities_over_framed_items():
    buf = ReplayBuffer(400, alpha=1.0, eps=0.0, seed=2)
    feed = Feed(buf, "reset")
    feed.fragment(T=20)
    batch, idx, _ = buf.sample_many(1, 16)
    buf.update_priorities(np.arange(len(buf)), np.r_[np.full(len(buf) - 1, 1e-9), 1.0])
    batch, idx, _ = buf.sample_many(4, 64)
    assert (batch["uid"] == feed.items - 1).all()
    feed.check(batch)


def test_stale_priority_updates_for_evicted_items_are_skipped():
    buf = ReplayBuffer(60, alpha=1.0, eps=0.0, seed=3)
    feed = Feed(buf, "reset", E=2)
    feed.fragment(T=6)
    batch, idx, _ = buf.sample_many(1, 8)
    for _ in range(12):  # overwrite every frame: the sampled items are gone
        feed.fragment(T=6)
    before = buf.state_dict()["priorities"].copy()
    buf.update_priorities(idx, np.full(idx.shape, 50.0), batch["_generation"])
    np.testing.assert_array_equal(buf.state_dict()["priorities"], before)


def test_fragments_join_their_streams_so_a_step_costs_about_a_frame():
    """Long episodes cut into short fragments: the ring holds about one frame per stored step."""
    buf = ReplayBuffer(2000, seed=4)
    feed = Feed(buf, "reset", E=2, shape=(84, 84))
    for env in feed.runner.envs:
        env.unwrapped.p_end = 0.0
        env.env._max_episode_steps = 10**6
    for _ in range(20):
        feed.fragment(T=16)
    ring = buf.state_dict()["frames"]
    assert ring["count"] <= feed.items + 2 * (K + 1)
    assert 84 * 84 < buf.bytes_per_item < 84 * 84 * 1.05


@pytest.mark.parametrize("prioritized", [True, False])
def test_state_round_trip_through_the_checkpoint_file(tmp_path, prioritized):
    buf = ReplayBuffer(100, prioritized=prioritized, seed=5)
    feed = Feed(buf, "zero")
    for i in range(15):
        feed.fragment(T=4)
        if i % 3 == 0:
            batch, idx, _ = buf.sample_many(1, 8)
            buf.update_priorities(idx, feed.rng.random(idx.shape), batch["_generation"])
    xa, xb = reloaded_alike(tmp_path, buf, lambda: feed.message(T=4))
    assert all(np.array_equal(xa[k], xb[k]) for k in xa)


def test_bad_framed_messages_change_nothing():
    buf = ReplayBuffer(50, seed=6)
    feed = Feed(buf, "reset")
    feed.fragment(T=3)
    traj = feed.runner.rollout(3)
    msg, rows, _ = flat_transitions(feed.encoder, traj, GAMMA, N)
    msg["uid"] = np.arange(len(rows))
    before = digest(buf.state_dict())
    for bad in ({**msg, OBS_REF: msg[OBS_REF] + 10**6}, {**msg, FRAMES: msg[FRAMES][:, :2]},
                {k: v for k, v in msg.items() if k != KINDS}):
        with pytest.raises(ValueError):
            buf.add(bad)
    with pytest.raises(ValueError):
        buf.add(msg, np.ones(len(rows) + 1))
    assert digest(buf.state_dict()) == before
