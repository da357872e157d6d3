"""What every algorithm shares: observations keep their dtype on the way to replay."""
import numpy as np
import pytest

from distrl.algos.common import stored_obs


@pytest.mark.parametrize("dtype, stored", [(np.float64, np.float32), (np.float32, np.float32), (np.float16, np.float32),
                                           (np.uint8, np.uint8), (bool, bool), (np.int64, np.int64)])
def test_stored_obs_keeps_bytes_and_bools_and_casts_floats_to_float32(dtype, stored):
    obs = (np.arange(12).reshape(3, 4) % 2).astype(dtype)
    out = stored_obs(obs)
    assert out.dtype == stored
    np.testing.assert_array_equal(out, obs)  # the values themselves: scaling is the network's (InputScale)


def test_stored_obs_does_not_copy_what_it_keeps():
    frames = np.zeros((2, 4, 4), np.uint8)
    floats = np.zeros((2, 3), np.float32)
    assert stored_obs(frames) is frames and stored_obs(floats) is floats
