"""The rate limiter's semantics (Reverb's SampleToInsertRatio) and that it cannot deadlock. How a run sizes
its buffer is the runtime's (tests/runtime/test_pacing.py)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl.replay.rate_limiter import RateLimiter


def test_nothing_is_sampled_before_min_size():
    lim = RateLimiter(samples_per_insert=4.0, min_size=100, error_buffer=50.0)
    lim.inserts = 99
    assert not lim.can_sample(1) and lim.sample_allowance() == 0
    assert lim.can_insert(1)  # reaching min_size is always allowed
    lim.inserts = 100
    assert lim.can_sample(50) and not lim.can_sample(51) and lim.sample_allowance() == 50


def test_each_side_blocks_when_it_runs_ahead_by_more_than_the_buffer():
    lim = RateLimiter(samples_per_insert=2.0, min_size=10, error_buffer=8.0, inserts=20)
    # 10 items past min_size at 2 samples each: 20 samples are due, 8 more may run ahead.
    assert lim.sample_allowance() == 28
    lim.samples = 28
    assert not lim.can_sample(1)
    # Workers may insert until the learner is 8 samples behind: (20 + n) * 2 - 28 <= 20 + 8.
    assert lim.can_insert(8) and not lim.can_insert(9)
    lim.inserts = 28
    assert not lim.can_insert(1) and lim.can_sample(16) and not lim.can_sample(17)  # 56 - 28 - n >= 20 - 8


def test_observed_ratio_counts_past_min_size():
    lim = RateLimiter(2.0, 10, 4.0, inserts=30, samples=40)
    assert lim.observed_ratio() == 2.0
    assert RateLimiter(2.0, 10, 4.0, inserts=10).observed_ratio() is None


@settings(max_examples=300, deadline=None)
@given(spi=st.floats(0.05, 64.0), min_size=st.integers(1, 500), max_insert=st.integers(1, 300),
       batch=st.integers(1, 600), slack=st.floats(1.0, 3.0), seed=st.integers(0, 2**31))
def test_a_deadlock_free_buffer_always_lets_one_side_move_and_holds_the_ratio(spi, min_size, max_insert, batch,
                                                                             slack, seed):
    """Driven as the driver drives it: workers insert bursts of 1..max_insert items (a fragment, or many
    sequences at once after short episodes) whenever one more item fits, the learner samples batches.
    Whenever one side is blocked the other can move, and the ratio stays within the buffer (plus one burst)."""
    e = slack * (spi + batch) / 2
    assert RateLimiter.deadlock_free(spi, e, batch)
    lim = RateLimiter(spi, min_size, e)
    rng = np.random.default_rng(seed)
    for _ in range(300):
        can_i, can_s = lim.can_insert(1), lim.can_sample(batch)
        assert can_i or can_s, (lim, batch)
        if can_i and (not can_s or rng.random() < 0.5):
            lim.inserts += int(rng.integers(1, max_insert + 1))
        else:
            lim.samples += batch
        if lim.inserts >= min_size:
            dev = lim.diff - lim.offset
            assert -e - 1e-6 <= dev <= e + spi * max_insert + 1e-6


def drive(lim: RateLimiter, batch: int, steps: int = 20_000) -> bool:
    """The learner samples a batch whenever it may, else the workers insert one item if one fits;
    False as soon as neither side can move."""
    for _ in range(steps):
        if lim.can_sample(batch):
            lim.samples += batch
        elif lim.can_insert(1):
            lim.inserts += 1
        else:
            return False
    return True


@pytest.mark.parametrize("spi, batch", [(2.0, 10), (16.0, 512), (0.5, 3), (1.0, 1), (0.25, 256), (100.0, 1)])
def test_the_smallest_error_buffer_never_stalls_and_half_of_it_does(spi, batch):
    least = RateLimiter.smallest_error_buffer(spi, batch)
    assert RateLimiter.deadlock_free(spi, least, batch) and not RateLimiter.deadlock_free(spi, least * 0.99, batch)
    assert drive(RateLimiter(spi, 1, least), batch)
    assert not drive(RateLimiter(spi, 1, least / 2), batch)
