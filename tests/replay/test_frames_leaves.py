"""Image leaves of a structured observation stored once per frame in flat replay: sampled batches equal
per-step storage's, the bytes they save, checkpoints, and messages refused whole."""
import numpy as np
import pytest
from gymnasium import spaces

from distrl import tree
from distrl.replay import ReplayBuffer
from distrl.replay.frames import (FRAMES, KINDS, NEXT_REF, OBS_REF, FrameEncoder, frame_stacks, frame_transitions,
                                  framed_key)
from distrl.replay.nstep import nstep_transitions
from distrl.replay.sizing import flat_item_bytes, tree_bytes
from distrl.replay.store import digest
from tests.replay.stacking import LeafEnv, Runner, make_leaf_envs, reloaded_alike

GAMMA, N = 0.9, 3
IMAGES = ["obs.image", "obs.views#0"]  # the Dict's image and the one inside its Tuple


def columns(obs) -> dict:
    return tree.to_columns({"obs": obs})


class LeafFeed:
    """Fragments of `LeafEnv`s as framed messages (items tagged "uid"), with each item's per-step transition
    (its obs and n-step next obs as trees, as replay without frames stores them) by uid."""

    def __init__(self, E: int = 3, seed: int = 0, **env):
        self.runner = Runner(make_leaf_envs(E, seed=seed, **env), seed=seed)
        self.encoders, self.naive, self.items = None, {}, 0
        self.rng = np.random.default_rng(seed)

    def message(self, T: int, framed: bool = True) -> tuple[dict, np.ndarray]:
        traj = self.runner.rollout(T)
        obs, nxt = columns(traj.obs), columns(traj.next_obs)
        if self.encoders is None:
            self.encoders = {c: FrameEncoder(k, seed=7) for c, k in frame_stacks(obs, 0).items()}
        msg, rows, boot = frame_transitions(self.encoders if framed else {}, obs, traj.actions, traj.rewards,
                                            traj.terminated, traj.truncated, nxt, GAMMA, N)
        steps = np.arange(traj.rewards.size).reshape(traj.rewards.shape)
        ref = nstep_transitions(steps, traj.actions, traj.rewards, traj.terminated, traj.truncated, steps, GAMMA, N)
        order = steps.T.ravel()  # framed items come env by env
        assert np.array_equal(rows, ref["obs"][order]) and np.array_equal(boot, ref["next_obs"][order])
        flat_obs, flat_next = tree.flatten_lead(traj.obs, 2), tree.flatten_lead(traj.next_obs, 2)
        ids = self.items + np.arange(len(rows))
        self.items += len(rows)
        for u, r, b, j in zip(ids, rows, boot, order):
            self.naive[int(u)] = {"obs": tree.index(flat_obs, r), "next_obs": tree.index(flat_next, b),
                                  "discounts": ref["discounts"][j], "rewards": ref["rewards"][j]}
        return {**msg, "uid": ids, "version": np.zeros(len(ids), np.int32)}, self.rng.random(len(ids)) + 0.1

    def check(self, batch: dict) -> None:
        """Every sampled item's obs and next obs equal its per-step transition leaf by leaf, in its dtype."""
        uid = batch["uid"].ravel()
        for name in ("obs", "next_obs", "rewards", "discounts"):
            got = tree.flatten_lead(batch[name], 2) if batch["uid"].ndim == 2 else batch[name]
            want = tree.stack([self.naive[int(u)][name] for u in uid])
            for (path, g), (_, w) in zip(tree.named_leaves(got), tree.named_leaves(want)):
                assert g.dtype == w.dtype and np.array_equal(g, w), f"{name} {path}"
            assert tree.structure_text(got) == tree.structure_text(want)


def test_only_image_leaves_are_kept_as_frames_and_a_flat_stack_as_its_column():
    obs = columns(Runner(make_leaf_envs(2)).rollout(3).obs)
    assert frame_stacks(obs, 0) == {"obs.image": 0, "obs.views#0": 0}
    assert frame_stacks({"obs": np.zeros((3, 2, 4, 5, 5), np.uint8)}, 4) == {"obs": 4}
    assert frame_stacks({"obs": np.zeros((3, 2, 5, 5, 3), np.uint8)}, 0) == {}  # a flat frame: per step, as before
    assert framed_key(FRAMES, "obs") == FRAMES and framed_key(OBS_REF, "obs.image") == "obs_frame/obs.image"


@pytest.mark.parametrize("prioritized", [True, False])
def test_sampled_image_leaves_equal_per_step_storage_through_episode_ends_and_ring_wrap_around(prioritized):
    """Many fragments (episodes end and truncate within and across them) through a small replay whose frame
    rings wrap around several times: every sampled obs and n-step next obs, image leaves as uint8, is the
    per-step transition's; the other leaves ride along per item; only live items are sampled."""
    buf, feed = ReplayBuffer(90, prioritized=prioritized, seed=1), LeafFeed()
    for i in range(60):
        buf.add(*feed.message(T=[1, 5, 7][i % 3]))
        batch, idx, _ = buf.sample_many(2, 32)
        feed.check(batch)
        assert batch["obs"]["image"].dtype == batch["next_obs"]["views"][0].dtype == np.uint8
        assert not any("frame" in k for k in batch)  # refs and oldest frames stay inside
        assert batch["uid"].min() >= feed.items - len(buf)
        buf.update_priorities(idx, feed.rng.random(idx.shape), batch["_generation"])
    state = buf.state_dict()
    for c in IMAGES:
        assert state[framed_key(FRAMES, c)]["count"] > 4 * state[framed_key(FRAMES, c)]["capacity"]
    assert 60 < len(buf) <= 90, "eviction follows the frames, not much sooner"
    one, _, _ = buf.sample(16)  # one batch: (16, ...) leaves
    feed.check(one)


def test_an_image_leaf_costs_one_frame_per_transition_where_per_step_storage_costs_two():
    """Long episodes of 32x32x3 images (and the 5x6x3 view) in 16-step fragments: per-step storage holds each
    image twice per item (obs, next obs), frames once (and a few refs); the memory check's figure is what
    the store allocates."""
    image, cap = 32 * 32 * 3, 1000
    sizes = {}
    for framed in (False, True):
        buf, feed = ReplayBuffer(cap, seed=2), LeafFeed(E=4, shape=(32, 32, 3), p_end=0.01, max_steps=10**6)
        for _ in range(25):
            buf.add(*feed.message(T=16, framed=framed))
        assert len(buf) > 0.9 * cap  # a full framed replay holds a little fewer (as with stacked frames)
        sizes[framed] = buf.bytes_per_item
    assert 2 * image < sizes[False] < 2 * image + 400
    assert image < sizes[True] < 1.1 * image + 300 and sizes[False] - sizes[True] > 0.9 * image
    allocated = buf.nbytes + 8 * cap + tree_bytes(cap) * cap  # + generations and the sum tree
    predicted = flat_item_bytes(LeafEnv((32, 32, 3)).observation_space, spaces.Discrete(2), cap) + 8  # + "uid"
    assert abs(allocated - cap * predicted) <= cap


@pytest.mark.parametrize("prioritized", [True, False])
def test_state_round_trip_through_the_checkpoint_file(tmp_path, prioritized):
    buf, feed = ReplayBuffer(80, prioritized=prioritized, seed=5), LeafFeed(seed=3)
    for i in range(25):
        buf.add(*feed.message(T=4))
        if i % 3 == 0:
            batch, idx, _ = buf.sample_many(1, 8)
            buf.update_priorities(idx, feed.rng.random(idx.shape), batch["_generation"])
    state = buf.state_dict()
    assert {framed_key(FRAMES, c) for c in IMAGES} <= set(state) and FRAMES not in state
    xa, xb = reloaded_alike(tmp_path, buf, lambda: feed.message(T=4))
    feed.check(xb)
    assert all(np.array_equal(a, b) for a, b in zip(tree.leaves(xa), tree.leaves(xb)))


def test_bad_leaf_messages_change_nothing():
    buf, feed = ReplayBuffer(50, seed=6), LeafFeed(seed=4)
    buf.add(*feed.message(T=3))
    msg, p = feed.message(T=3)
    before = digest(buf.state_dict())
    view = "obs.views#0"
    bad = [{**msg, framed_key(OBS_REF, view): msg[framed_key(OBS_REF, view)] + 10**6},
           {**msg, framed_key(FRAMES, view): msg[framed_key(FRAMES, view)][..., :2]},
           {k: v for k, v in msg.items() if k != framed_key(KINDS, view)},
           {k: v for k, v in msg.items() if k != framed_key(NEXT_REF, "obs.image")}]
    for m in bad:  # the image's ring would take its frames first: the view's fault must stop it too
        with pytest.raises(ValueError):
            buf.add(m, p)
    with pytest.raises(ValueError):
        buf.add(msg, np.ones(len(p) + 1))
    assert digest(buf.state_dict()) == before
    buf.add(msg, p)
    assert digest(buf.state_dict()) != before
