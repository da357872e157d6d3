"""Updates as CUDA graphs: the branch-free paths a graph needs compute what the plain ones do (on the
CPU), and on a GPU a recorded update is the plain update, skips a non-finite step, and is recorded again
after a checkpoint is loaded (skipped without CUDA)."""
import copy
import os

import numpy as np
import pytest
import torch

from distrl.algos.capture import capturable, static_shapes
from distrl.config import load_config
from distrl.roles.factory import make_algorithm
from distrl.roles.learning import update_once
from tests.algos import test_dhc, test_r2d2
from tests.algos.test_r2d2_acting import SPEC

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEQUENCE = ["sequence.burn_in=2", "sequence.length=6"]


def r2d2_case(device="cpu"):
    cfg = load_config(None, ["algo=r2d2", *SEQUENCE, "r2d2.n_step=3"])
    batch = test_r2d2.make_batch(np.random.default_rng(1), 11, 8, (2, 64), first_at=[2, None, 5, 0, None, 7, 3, None])
    return make_algorithm(cfg, SPEC).make_learner(device), batch


def dhc_case(device="cpu"):
    cfg = load_config(None, ["algo=dhc", *SEQUENCE, "dhc.n_step=3"])
    batch = test_dhc.make_batch(np.random.default_rng(1), 11, 6, 3, first_at=[2, None, 5, 0, None, 7], core=64)
    return make_algorithm(cfg, test_dhc.IMAGE).make_learner(device), batch


def same_update(a, b, batch, rtol=1e-5, atol=1e-6):
    """One update of each from the same weights and optimizer state: the same loss, priorities and gradients
    (float32 sums in another order: `rtol`, and `atol` of the largest gradient), and weights within what one
    Adam step can part them by. Adam divides each gradient by its own running scale, so a near-zero
    gradient that two kernels round apart can move its weight by up to lr either way: two such steps differ
    by at most 2 lr per weight. `b` is then made `a` again, so that no drift accumulates across calls."""
    out_a, out_b = update_once(a, batch), update_once(b, batch)
    for key in ("loss", "q_mean", "grad_norm"):
        assert out_a[key] == pytest.approx(out_b[key], rel=rtol, abs=atol), key
    np.testing.assert_allclose(out_a["priorities"], out_b["priorities"], rtol=rtol, atol=atol)
    largest = max(float(p.grad.abs().max()) for p in b.q.parameters() if p.grad is not None)
    lr = max(group["lr"] for group in b.opt.param_groups)
    for (name, p), q in zip(a.q.named_parameters(), b.q.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol * max(largest, 1.0), msg=name)
        torch.testing.assert_close(p, q, rtol=0.0, atol=2 * lr, msg=name)
    b.load_state_dict(copy.deepcopy(a.state_dict()))


def test_no_graph_is_recorded_on_the_cpu():
    learner, _ = r2d2_case()
    learner.capture_update()
    assert not capturable("cpu", True) and learner.graphed is None


@pytest.mark.parametrize("case", [r2d2_case, dhc_case])
def test_the_branch_free_sequence_update_is_the_plain_one(case):
    """Recurrent cores unroll a step at a time with every state masked (no episode starts read back),
    DHC encodes every row: the same update, episodes starting mid-sequence included."""
    plain, batch = case()
    static = copy.deepcopy(plain)
    static_shapes(static.q, static.target)
    assert static.q.core.static and not plain.q.core.static
    for _ in range(3):
        same_update(static, plain, batch)


# ----------------------------------------------------------------------------- on a GPU
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def apex_case(device):
    cfg = load_config(os.path.join(ROOT, "configs", "apex_dqn_minatar_breakout.yaml"), ["learner.batch_size=64"])
    rng = np.random.default_rng(0)
    batch = {"obs": rng.integers(0, 2, (64, 10, 10, 4)).astype(bool), "actions": rng.integers(0, 3, 64),
             "rewards": rng.normal(size=64).astype(np.float32), "discounts": np.full(64, 0.97, np.float32),
             "next_obs": rng.integers(0, 2, (64, 10, 10, 4)).astype(bool),
             "weights": rng.uniform(0.5, 1, 64).astype(np.float32)}
    return make_algorithm(cfg).make_learner(device), batch


@gpu
@pytest.mark.parametrize("case", [apex_case, r2d2_case, dhc_case])
def test_a_recorded_update_is_the_plain_update_and_skips_a_nonfinite_step(case):
    torch.manual_seed(0)
    plain, batch = case("cuda")
    graphed = copy.deepcopy(plain)
    graphed.capture_update()
    assert graphed.graphed is not None
    for _ in range(5):
        same_update(graphed, plain, batch, rtol=1e-4, atol=1e-5)
    assert len(graphed.graphed.graphs) == 1 and graphed.updates == plain.updates == 5
    poisoned = dict(batch, rewards=np.full_like(batch["rewards"], np.nan))
    before = copy.deepcopy(graphed.state_dict())
    out = update_once(graphed, poisoned)
    assert out["nonfinite"] and graphed.updates == 5
    for key, value in before["q"].items():
        assert torch.equal(value, graphed.q.state_dict()[key]), key
    same_update(graphed, plain, batch, rtol=1e-4, atol=1e-5)  # training goes on as if it never happened


@gpu
def test_a_recorded_sac_update_is_the_plain_update():
    cfg = load_config(os.path.join(ROOT, "configs", "sac_pendulum.yaml"), ["learner.batch_size=64"])
    rng = np.random.default_rng(0)
    batch = {"obs": rng.normal(size=(64, 3)).astype(np.float32), "actions": rng.uniform(-1, 1, (64, 1)).astype(np.float32),
             "rewards": rng.normal(size=64).astype(np.float32), "discounts": np.full(64, 0.99, np.float32),
             "next_obs": rng.normal(size=(64, 3)).astype(np.float32)}
    plain = make_algorithm(cfg).make_learner("cuda")
    graphed = copy.deepcopy(plain)
    graphed.capture_update()
    for _ in range(3):  # the same random draws: each update's noise comes from the same generator state
        torch.cuda.manual_seed(1)
        out_p = update_once(plain, batch)
        torch.cuda.manual_seed(1)
        out_g = update_once(graphed, batch)
        assert np.isfinite(out_g["loss"]) and out_g["loss"] == pytest.approx(out_p["loss"], rel=1e-3, abs=1e-4)


@gpu
def test_a_loaded_checkpoint_is_trained_on_by_a_graph_recorded_again():
    trained, batch = apex_case("cuda")
    trained.capture_update()
    for _ in range(3):
        update_once(trained, batch)
    state = copy.deepcopy(trained.state_dict())
    resumed, _ = apex_case("cuda")
    resumed.capture_update()
    update_once(resumed, batch)  # recorded with the fresh optimizer's state
    resumed.load_state_dict(state)
    assert not resumed.graphed.graphs
    same_update(resumed, trained, batch, rtol=1e-4, atol=1e-5)
