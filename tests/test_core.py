"""The learner's scalar diagnostics, summed per block for the driver's learner.jsonl (distrl/core.py)."""
import math

import numpy as np

from distrl.core import NONFINITE, TrainStats


def test_scalars_are_summed_with_counts_nonfinite_ones_counted_and_everything_else_skipped():
    stats = TrainStats()
    stats.add_scalars({"alpha": 0.5, "entropy": np.float32(-1.5), "steps": np.int64(3), "loss": 9.0,
                       "priorities": np.ones(4), "dropped": 0, "flag": True, "bad": math.nan, "name": "x"})
    stats.add_scalars({"alpha": 0.25, "entropy": -0.5, "bad": math.inf, "q": -math.inf})
    assert stats.scalars == {"alpha": [0.75, 2], "entropy": [-2.0, 2], "steps": [3.0, 1],
                             NONFINITE + "bad": [2.0, 2], NONFINITE + "q": [1.0, 1]}
    assert all(type(total) is float for total, _ in stats.scalars.values())
