"""Communication masks from agents' positions."""
from __future__ import annotations

import numpy as np

from distrl.envs.comm import comm_mask_from_positions


def test_comm_mask_from_positions():
    pos = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [3.5, 0.0], [0.0, 1.0]])
    active = np.array([True, True, True, True, True])
    m = comm_mask_from_positions(pos, active, k=1)
    assert [np.flatnonzero(r).tolist() for r in m] == [[1], [0], [3], [2], [0]]  # 0: 1 and 4 tie -> 1
    assert not m.diagonal().any() and m[4, 0] and not m[0, 4]
    m = comm_mask_from_positions(pos, active, view_radius=1.0)
    assert np.array_equal(m, m.T)
    assert [np.flatnonzero(r).tolist() for r in m] == [[1, 4], [0, 4], [3], [2], [0, 1]]
    active[1] = False
    m = comm_mask_from_positions(pos, active, k=1)
    assert not m[1].any() and not m[:, 1].any() and m[0, 4]
    assert not comm_mask_from_positions(pos, active, k=0).any()
