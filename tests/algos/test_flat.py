"""Flat parameter buffers and the numpy Adam against torch's own Adam."""
import numpy as np
import pytest
import torch

from distrl.algos.flat import FlatAdam, FlatParams


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 4, generator=g, requires_grad=True), torch.randn(4, generator=g, requires_grad=True),
            torch.randn(2, 1, 5, generator=g, requires_grad=True), torch.tensor(0.3, requires_grad=True)]


def test_flat_params_share_memory_both_ways():
    ps = _params()
    before = [p.detach().clone() for p in ps]
    flat = FlatParams(ps)
    for p, b, v in zip(ps, before, flat.views):
        torch.testing.assert_close(p.detach(), b)  # values kept
        np.testing.assert_array_equal(v, b.numpy())
    flat.flat += 1.0  # numpy writes are seen by torch ...
    torch.testing.assert_close(ps[0].detach(), before[0] + 1.0)
    with torch.no_grad():  # ... and torch's in-place writes (load_state_dict) by numpy
        ps[2].copy_(torch.zeros(2, 1, 5))
    assert not flat.views[2].any() and flat.flat[flat.slices[2]].sum() == 0.0
    grads, views = flat.like()
    assert grads.shape == flat.flat.shape and [v.shape for v in views] == [tuple(p.shape) for p in ps]


@pytest.mark.parametrize("fused", [False, True])
def test_flat_adam_steps_like_torch_adam_with_param_groups(fused):
    ref, ps = _params(), _params()
    lrs = (1e-2, 3e-3, 5e-2)
    groups = lambda xs: [{"params": xs[:2], "lr": lrs[0]}, {"params": [xs[2]], "lr": lrs[1]},  # noqa: E731
                         {"params": [xs[3]], "lr": lrs[2]}]
    ref_opt = torch.optim.Adam(groups(ref), lr=1.0, fused=fused)
    flat = FlatParams(ps)
    adam = FlatAdam(torch.optim.Adam(groups(ps), lr=1.0, fused=fused), flat, ps)
    grads, views = flat.like()
    rng = np.random.default_rng(0)
    for _ in range(6):
        for r, v in zip(ref, views):
            v[...] = rng.standard_normal(v.shape).astype(np.float32)
            r.grad = torch.from_numpy(v.copy())
        ref_opt.step()
        adam.step(grads)
    for r, p in zip(ref, ps):
        torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-5, atol=1e-6)
    # Its state in torch's format equals torch's own, and loads back.
    adam.save_to_torch()
    for r, p in zip(ref, ps):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(adam.opt.state[p][key], ref_opt.state[r][key], rtol=1e-5, atol=1e-7)
        assert float(adam.opt.state[p]["step"]) == float(ref_opt.state[r]["step"]) == 6
    other = FlatAdam(adam.opt, flat, ps)
    np.testing.assert_array_equal(other.exp_avg_sq, adam.exp_avg_sq)
    assert other.steps == 6 and other.lr[flat.slices[2]].tolist() == [np.float32(3e-3)] * 10


def test_flat_adam_refuses_what_it_does_not_implement():
    ps = _params()
    flat = FlatParams(ps)
    with pytest.raises(ValueError, match="weight decay"):
        FlatAdam(torch.optim.Adam(ps, weight_decay=0.1), flat, ps)
    with pytest.raises(ValueError, match="one betas/eps"):
        FlatAdam(torch.optim.Adam([{"params": ps[:2]}, {"params": ps[2:], "eps": 1e-5}]), flat, ps)
