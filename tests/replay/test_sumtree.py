"""SumTree against a brute-force numpy reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl.replay import SumTree

values = st.one_of(st.just(0.0), st.floats(1e-6, 100.0), st.floats(1e-12, 1e-9))


@st.composite
def update_sequences(draw):
    cap = draw(st.integers(1, 40))
    batch = st.lists(st.tuples(st.integers(0, cap - 1), values), min_size=0, max_size=20)
    return cap, draw(st.lists(batch, min_size=1, max_size=6))


def _check_find(tree: SumTree, leaves: np.ndarray, us: np.ndarray) -> None:
    total = tree.total
    cum = np.cumsum(leaves)
    got = tree.find(us)
    assert got.shape == us.shape
    assert np.all(got < len(leaves))
    assert np.all(leaves[got] > 0)
    want = np.searchsorted(cum, us, side="right")
    # Round-off may shift a hit across a boundary; then u must sit right at it.
    tol = 1e-9 * total
    lo = np.where(got > 0, cum[np.maximum(got - 1, 0)], 0.0)
    hi = cum[got]
    uc = np.clip(us, 0.0, total)
    ok = (got == want) | ((uc >= lo - tol) & (uc <= hi + tol))
    assert ok.all(), (us[~ok], got[~ok], want[~ok])


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(update_sequences(), st.integers(0, 2**32 - 1))
def test_matches_reference(seq, seed):
    cap, batches = seq
    tree = SumTree(cap)
    ref = np.zeros(cap)
    ever_max = 0.0
    for batch in batches:
        idx = np.array([i for i, _ in batch], dtype=np.int64)
        val = np.array([v for _, v in batch], dtype=np.float64)
        tree.update(idx, val)
        for i, v in batch:  # sequential assignment == "last one wins"
            ref[i] = v
        if batch:
            ever_max = max(ever_max, ref[np.unique(idx)].max())
    np.testing.assert_array_equal(tree.get(np.arange(cap)), ref)
    assert tree.total == pytest.approx(ref.sum(), rel=1e-12, abs=1e-300)
    assert tree.max_value == ever_max
    if ref.sum() > 0:
        rng = np.random.default_rng(seed)
        us = rng.random(64) * tree.total
        # Boundary and out-of-range values exercise the guards.
        edges = np.concatenate([np.cumsum(ref), [0.0, tree.total, tree.total * 1.5, -1.0]])
        _check_find(tree, ref, np.concatenate([us, edges]))
    else:
        with pytest.raises(ValueError):
            tree.find(np.array([0.0]))


def test_duplicates_last_wins_and_exact_sums():
    tree = SumTree(5)
    tree.update(np.array([0, 1, 0, 4, 1]), np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    np.testing.assert_array_equal(tree.get(np.arange(5)), [3.0, 5.0, 0.0, 0.0, 4.0])
    assert tree.total == 12.0
    # Repeated overwrites must not accumulate drift.
    for _ in range(50):
        tree.update(np.array([2]), np.array([0.1]))
        tree.update(np.array([2]), np.array([0.0]))
    assert tree.total == 12.0


def test_find_skips_zero_leaves_and_padding():
    tree = SumTree(3)  # padded to 4 leaves
    tree.update(np.array([0, 1, 2]), np.array([0.0, 1.0, 0.0]))
    got = tree.find(np.array([0.0, 0.5, 0.999999, 1.0, 5.0, -3.0]))
    np.testing.assert_array_equal(got, [1, 1, 1, 1, 1, 1])


def test_find_shape_and_single_leaf():
    tree = SumTree(1)
    tree.update(np.array([0]), np.array([2.0]))
    assert tree.total == 2.0
    assert tree.find(np.zeros((2, 3))).shape == (2, 3)
    assert np.all(tree.find(np.full((2, 3), 1.9)) == 0)


def test_set_all_and_validation():
    tree = SumTree(6)
    vals = np.arange(6, dtype=np.float64)
    tree.set_all(vals)
    assert tree.total == 15.0
    np.testing.assert_array_equal(tree.get(np.arange(6)), vals)
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(IndexError):
        tree.update(np.array([6]), np.array([1.0]))
