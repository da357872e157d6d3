"""What every algorithm shares: observations keep their dtype on the way to replay."""
import copy

import numpy as np
import pytest
import torch

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


def test_optimizer_state_from_another_layout_is_laid_out_as_its_parameter():
    """Adam's moments saved for a row-major weight, loaded for an input-major one (a checkpoint from before
    the torso stored it so): the fused Adam walks both in memory order, so they must be re-laid out."""
    from distrl.algos.common import adam, load_optimizer_state

    torch.manual_seed(0)
    row_major, input_major = torch.nn.Linear(6, 4), torch.nn.Linear(6, 4)
    input_major.weight.data = input_major.weight.data.t().contiguous().t()
    input_major.load_state_dict(row_major.state_dict())
    x = torch.randn(3, 6)
    opt = adam(row_major.parameters(), 0.1, "cpu")
    row_major(x).square().sum().backward()
    opt.step()
    moved = adam(input_major.parameters(), 0.1, "cpu")
    input_major.load_state_dict(row_major.state_dict())
    load_optimizer_state(moved, copy.deepcopy(opt.state_dict()))  # as from a checkpoint: no shared tensors
    assert moved.state[input_major.weight]["exp_avg"].stride() == input_major.weight.stride()
    for module, optimizer in ((row_major, opt), (input_major, moved)):
        optimizer.zero_grad()
        module(x).square().sum().backward()
        optimizer.step()
    torch.testing.assert_close(input_major.weight, row_major.weight, rtol=1e-6, atol=1e-7)
