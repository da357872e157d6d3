import numpy as np

from distrl.runtime.counters import Reservoir


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
