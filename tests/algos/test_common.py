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


def test_a_guarded_step_is_torchs_adam_step_and_skips_a_nonfinite_gradient():
    from distrl.algos.common import adam, guarded_step

    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    theirs.load_state_dict(ours.state_dict())
    opt_ours, opt_theirs = adam(ours.parameters(), 0.01, "cpu"), adam(theirs.parameters(), 0.01, "cpu")
    for i in range(4):
        x = torch.randn(8, 5)
        _, skipped = guarded_step(opt_ours, ours.parameters(), ours(x).square().sum(), clip=1.0)
        assert not skipped
        opt_theirs.zero_grad(set_to_none=True)
        theirs(x).square().sum().backward()
        torch.nn.utils.clip_grad_norm_(list(theirs.parameters()), 1.0, foreach=True)
        opt_theirs.step()  # torch's own wrappers around the step
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)
    before = copy.deepcopy(ours.state_dict())
    _, skipped = guarded_step(opt_ours, ours.parameters(), ours(torch.full((2, 5), float("nan"))).sum())
    assert skipped and all(torch.equal(v, ours.state_dict()[k]) for k, v in before.items())


def test_a_learner_builds_steps_saves_and_loads_its_optimizer_without_importing_torch_dynamo():
    """torch.optim would import torch._dynamo (~1 s of CPU on each learner start) to exclude compilation
    from calls distrl never compiles."""
    import subprocess
    import sys

    code = """
import sys, torch
from distrl.algos.common import adam, guarded_step, load_optimizer_state
net = torch.nn.Linear(4, 2)
opt = adam(net.parameters(), 0.01, "cpu")
guarded_step(opt, net.parameters(), net(torch.randn(3, 4)).square().sum())
load_optimizer_state(opt, opt.state_dict())
assert int(opt.state_dict()["state"][0]["step"]) == 1
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
