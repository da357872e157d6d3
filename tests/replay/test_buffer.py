"""ReplayBuffer: prioritized/uniform sampling, ring semantics, state round-trip."""

import numpy as np
import pytest

from distrl.replay import ReplayBuffer


def _items(start: int, b: int) -> dict[str, np.ndarray]:
    v = np.arange(start, start + b)
    return {"obs": np.stack([v, -v], axis=1).astype(np.float32), "act": v.astype(np.int64)}


def _leaves(buf: ReplayBuffer) -> np.ndarray:
    return buf.state_dict()["priorities"]


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_prioritized_frequencies(alpha):
    p = np.array([1.0, 2.0, 3.0, 4.0])
    buf = ReplayBuffer(8, alpha=alpha, eps=1e-9, seed=1)
    buf.add(_items(0, 4), priorities=p)
    _, idx, _ = buf.sample_many(500, 100)
    freq = np.bincount(idx.ravel(), minlength=8) / idx.size
    expected = p**alpha / np.sum(p**alpha)
    np.testing.assert_allclose(freq[:4], expected, atol=3e-3)
    assert freq[4:].sum() == 0


def test_importance_weights_closed_form():
    p = np.array([1.0, 2.0, 3.0, 4.0])
    buf = ReplayBuffer(4, alpha=1.0, beta0=0.4, beta_steps=10, eps=0.0, seed=2)
    buf.add(_items(0, 4), priorities=p)
    for step in range(3):
        beta = buf.beta
        assert beta == pytest.approx(0.4 + 0.6 * step / 10)
        _, idx, w = buf.sample(32)
        assert w.dtype == np.float32
        probs = p[idx] / p.sum()
        raw = (4 * probs) ** (-beta)
        np.testing.assert_allclose(w, raw / raw.max(), rtol=1e-6)
        assert w.max() == 1.0


def test_beta_annealing():
    buf = ReplayBuffer(4, beta0=0.4, beta_steps=10)
    buf.add(_items(0, 4))
    for _ in range(5):
        buf.sample(2)
    assert buf.beta == pytest.approx(0.7)
    buf.sample_many(5, 2)  # each batch counts as one call
    assert buf.beta == 1.0
    buf.sample(2)
    assert buf.beta == 1.0


def test_sample_many_per_batch_beta():
    p = np.array([1.0, 4.0])
    buf = ReplayBuffer(2, alpha=1.0, beta0=0.0, beta_steps=2, eps=0.0, seed=3)
    buf.add(_items(0, 2), priorities=p)
    _, idx, w = buf.sample_many(2, 16)
    # beta = 0 for batch 0 (all weights 1), 0.5 for batch 1.
    np.testing.assert_array_equal(w[0], 1.0)
    raw = (2 * p[idx[1]] / 5.0) ** -0.5
    np.testing.assert_allclose(w[1], raw / raw.max(), rtol=1e-6)


def test_uniform_mode():
    buf = ReplayBuffer(16, prioritized=False, seed=4)
    buf.add(_items(0, 10), priorities=np.full(10, 5.0))  # ignored
    batch, idx, w = buf.sample_many(1000, 100)
    assert w.dtype == np.float32 and np.all(w == 1.0)
    assert idx.max() < 10
    freq = np.bincount(idx.ravel(), minlength=10) / idx.size
    np.testing.assert_allclose(freq, 0.1, atol=5e-3)
    np.testing.assert_array_equal(batch["act"], idx)
    buf.update_priorities(idx[0], np.ones(100))  # no-op, no error


def test_sample_many_shapes():
    buf = ReplayBuffer(10, seed=5)
    buf.add(_items(0, 7))
    batch, idx, w = buf.sample_many(3, 4)
    assert batch["obs"].shape == (3, 4, 2) and batch["obs"].dtype == np.float32
    assert batch["act"].shape == (3, 4) and batch["_generation"].shape == (3, 4)
    assert idx.shape == (3, 4) and w.shape == (3, 4)
    np.testing.assert_array_equal(w.max(axis=1), 1.0)
    np.testing.assert_array_equal(batch["act"], idx)
    single, sidx, sw = buf.sample(6)
    assert single["obs"].shape == (6, 2) and sidx.shape == (6,) and sw.shape == (6,)


def test_ring_wraparound():
    buf = ReplayBuffer(5)
    buf.add(_items(0, 3))
    assert len(buf) == 3 and buf.capacity == 5
    buf.add(_items(3, 4))  # wraps: 3,4 at slots 3,4; 5,6 at slots 0,1
    assert len(buf) == 5
    np.testing.assert_array_equal(buf.state_dict()["storage/act"], [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(buf.state_dict()["generations"], [2, 2, 1, 1, 1])
    assert buf.nbytes == 5 * 2 * 4 + 5 * 8


def test_add_more_than_capacity_keeps_newest():
    buf = ReplayBuffer(5)
    buf.add(_items(0, 12))
    sd = buf.state_dict()
    # Cursor advanced by 12 -> items 7..11 sit at slots 2,3,4,0,1.
    np.testing.assert_array_equal(sd["storage/act"], [10, 11, 7, 8, 9])
    np.testing.assert_array_equal(sd["storage/obs"][:, 1], [-10, -11, -7, -8, -9])
    assert len(buf) == 5 and sd["cursor"] == 2
    buf.add(_items(12, 1))  # overwrites the oldest (7)
    np.testing.assert_array_equal(buf.state_dict()["storage/act"], [10, 11, 12, 8, 9])


def test_add_more_than_capacity_priorities():
    buf = ReplayBuffer(3, alpha=1.0, eps=0.0)
    buf.add(_items(0, 5), priorities=np.arange(1.0, 6.0))
    # items 2,3,4 (priorities 3,4,5) land at slots 2,0,1.
    np.testing.assert_allclose(_leaves(buf), [4.0, 5.0, 3.0])


def test_key_errors():
    buf = ReplayBuffer(4)
    buf.add(_items(0, 2))
    with pytest.raises(ValueError, match="act"):
        buf.add({"obs": np.zeros((1, 2), np.float32)})
    with pytest.raises(ValueError, match="extra"):
        buf.add({**_items(0, 1), "extra": np.zeros(1)})
    with pytest.raises(ValueError):
        buf.add({"obs": np.zeros((2, 2), np.float32), "act": np.zeros(3, np.int64)})
    with pytest.raises(ValueError, match="_generation"):
        ReplayBuffer(4).add({"_generation": np.zeros(2)})
    with pytest.raises(ValueError):
        ReplayBuffer(4).sample(1)
    assert len(buf) == 2  # failed adds changed nothing


def test_max_priority_for_new_items():
    buf = ReplayBuffer(8, alpha=0.5, eps=1e-6)
    leaf = lambda p: (p + 1e-6) ** 0.5  # noqa: E731
    buf.add(_items(0, 1))
    assert _leaves(buf)[0] == pytest.approx(leaf(1.0))
    buf.add(_items(1, 2), priorities=np.array([0.5, 3.0]))
    buf.add(_items(3, 1))
    assert _leaves(buf)[3] == pytest.approx(leaf(3.0))
    buf.update_priorities(np.array([0]), np.array([-10.0]))  # |TD| is used
    assert _leaves(buf)[0] == pytest.approx(leaf(10.0))
    buf.add(_items(4, 1))
    assert _leaves(buf)[4] == pytest.approx(leaf(10.0))


def test_stale_priority_updates_skipped():
    buf = ReplayBuffer(4, alpha=1.0, eps=0.0, seed=6)
    buf.add(_items(0, 4), priorities=np.ones(4))
    batch, idx, _ = buf.sample(64)
    assert set(idx.tolist()) == {0, 1, 2, 3}
    buf.add(_items(4, 2))  # overwrites slots 0, 1 with max priority 1.0
    buf.update_priorities(idx, np.full(64, 100.0), batch["_generation"])
    np.testing.assert_allclose(_leaves(buf), [1.0, 1.0, 100.0, 100.0])
    # Without generations every update lands.
    buf.update_priorities(idx, np.full(64, 7.0))
    np.testing.assert_allclose(_leaves(buf), 7.0)


def test_update_priorities_duplicates_last_wins():
    buf = ReplayBuffer(4, alpha=1.0, eps=0.0)
    buf.add(_items(0, 4))
    buf.update_priorities(np.array([1, 1, 2]), np.array([5.0, 6.0, 2.0]))
    np.testing.assert_allclose(_leaves(buf), [1.0, 6.0, 2.0, 1.0])


@pytest.mark.parametrize("prioritized", [True, False])
def test_state_dict_roundtrip(prioritized):
    a = ReplayBuffer(16, prioritized=prioritized, beta_steps=50, seed=7)
    rng = np.random.default_rng(0)
    for i in range(4):
        a.add(_items(5 * i, 5), priorities=rng.random(5))
        _, idx, _ = a.sample(8)
        a.update_priorities(idx, rng.random(8))
    sd = a.state_dict()
    for k, v in sd.items():
        assert isinstance(v, (np.ndarray, int, float, bool)), k
    b = ReplayBuffer(16, prioritized=prioritized, beta_steps=50, seed=999)
    b.load_state_dict(sd)
    assert len(b) == len(a) and b.beta == a.beta and b.nbytes == a.nbytes
    for _ in range(3):
        ba, ia, wa = a.sample_many(2, 8)
        bb, ib, wb = b.sample_many(2, 8)
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(wa, wb)
        for k in ba:
            np.testing.assert_array_equal(ba[k], bb[k])
    # The snapshot is a copy: mutating the buffer later doesn't change it.
    a.add(_items(100, 3))
    assert not np.array_equal(a.state_dict()["storage/act"], sd["storage/act"])


def test_state_dict_empty_buffer():
    sd = ReplayBuffer(4).state_dict()
    b = ReplayBuffer(4)
    b.load_state_dict(sd)
    assert len(b) == 0 and b.nbytes == 0
    with pytest.raises(ValueError):
        ReplayBuffer(5).load_state_dict(sd)


@pytest.mark.parametrize("prioritized", [True, False])
def test_a_partly_filled_buffer_saves_only_its_items_and_resumes_identically(prioritized):
    a = ReplayBuffer(100_000, prioritized=prioritized, seed=3)
    a.add(_items(0, 40), priorities=np.arange(1.0, 41.0) if prioritized else None)
    sd = a.state_dict()
    assert len(sd["storage/act"]) == len(sd["generations"]) == 40 and a.checkpoint_nbytes == 40 * (2 * 4 + 8)
    b = ReplayBuffer(100_000, prioritized=prioritized, seed=99)
    b.load_state_dict(sd)
    for buf in (a, b):
        buf.add(_items(40, 5), priorities=np.full(5, 2.0) if prioritized else None)
    (ba, ia, wa), (bb, ib, wb) = a.sample(16), b.sample(16)
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_array_equal(wa, wb)
    for k in ba:
        np.testing.assert_array_equal(ba[k], bb[k])
    assert len(b) == 45 and b.nbytes == a.nbytes
