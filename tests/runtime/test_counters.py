import random

import numpy as np

from distrl.runtime.counters import Counters, HeldTime, Reservoir


def test_reservoir_keeps_everything_below_its_size():
    r = Reservoir(size=100)
    r.extend(range(60))
    assert r.seen == 60
    assert np.array_equal(r.values(), np.arange(60))


def test_reservoir_memory_is_bounded_and_sample_uniform():
    r = Reservoir(size=2000, seed=1)
    n = 200_000
    for start in range(0, n, 1000):  # arrives in blocks, like TrainStats.lags
        r.extend(range(start, start + 1000))
    v = r.values()
    assert r.seen == n and len(v) == 2000
    # A uniform sample of 0..n-1: each decile holds ~10% (binomial sd ~0.7%).
    counts = np.histogram(v, bins=10, range=(0, n))[0] / len(v)
    assert np.all(np.abs(counts - 0.1) < 0.035), counts
    assert abs(np.median(v) / n - 0.5) < 0.05


def test_a_rows_held_back_shares_are_of_its_own_interval_only():
    """Held-back time is charged after the fact, a whole pass at a time; with rows taken a while after a pass
    ends (an evaluation, the log itself), charging whole passes gave a row time from before it (179% once in
    `make run`). Every share is within 0-100%, and the shares add up to the time charged."""
    rng = random.Random(0)
    c, now = Counters(), 100.0
    held, row_at, charged, whole_pass_over = HeldTime(c, now), now, [0.0, 0.0], False
    last_pass_end, since_pass = now, [0.0, 0.0]
    for _ in range(2000):
        now += rng.uniform(0.001, 0.3)  # a pass: its time goes to the sides the pass before it held
        workers, learner = held.workers, held.learner
        held.passed(now, rng.random() < 0.6, rng.random() < 0.3)
        since_pass = [since_pass[0] + (now - last_pass_end) * workers, since_pass[1] + (now - last_pass_end) * learner]
        last_pass_end = now
        if rng.random() < 0.4:
            now += rng.uniform(0.0, 0.6)  # what the pass does after it ends, before the row
            shares = held.shares(now)
            assert all(0.0 <= s <= 1.0 + 1e-9 for s in shares), shares
            whole_pass_over |= any(s / (now - row_at) > 1.0 + 1e-9 for s in since_pass)
            charged = [x + s * (now - row_at) for x, s in zip(charged, shares)]
            row_at, since_pass = now, [0.0, 0.0]
    shares = held.shares(now + 1.0)
    charged = [x + s * (now + 1.0 - row_at) for x, s in zip(charged, shares)]
    assert whole_pass_over  # the old accounting would have shown a share above 100% here
    assert np.allclose(charged, [c.workers_blocked_s, c.learner_blocked_s], atol=1e-6)
    assert c.workers_blocked_s > 0 and c.learner_blocked_s > 0
