"""The recurrent cores: a fused unroll over T steps is T calls of `step`, and a `first` flag zeroes the
state of its batch row at its step, and nowhere else."""
import pytest
import torch

from distrl.models import RecurrentCore

T, B, F, C = 6, 3, 5, 4


def core_and_inputs(kind, seed=0):
    torch.manual_seed(seed)
    core = RecurrentCore(kind, F, C)
    x = torch.randn(T, B, F)
    state = torch.randn(B, *core.state_shape)
    return core, x, state


def stepped(core, x, state, first=None):
    """The reference: one `step` per time step, the state zeroed where `first`."""
    outs = []
    for t in range(len(x)):
        if first is not None:
            state = state * (~first[t]).float()[:, None, None]
        out, state = core.step(x[t], state)
        outs.append(out)
    return torch.stack(outs), state


@pytest.mark.parametrize("kind, slots", [("lstm", 2), ("gru", 1)])
def test_state_shapes(kind, slots):
    core, x, state = core_and_inputs(kind)
    assert core.state_shape == (slots, C) and core.out_features == C
    out, after = core.step(x[0], state)
    assert out.shape == (B, C) and after.shape == (B, slots, C)
    outs, final = core.unroll(x, state)
    assert outs.shape == (T, B, C) and final.shape == (B, slots, C)
    # The output is the new h: slot 0 of the state after the step.
    assert torch.equal(out, after[:, 0])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@torch.no_grad()
def test_unroll_equals_a_loop_of_steps(kind):
    core, x, state = core_and_inputs(kind)
    outs, final = core.unroll(x, state)
    ref_outs, ref_final = stepped(core, x, state)
    # The fused kernel batches the input projections over T: equal up to float rounding.
    torch.testing.assert_close(outs, ref_outs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(final, ref_final, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@torch.no_grad()
def test_first_zeroes_the_state_at_that_step_for_that_row_only(kind):
    core, x, state = core_and_inputs(kind)
    first = torch.zeros(T, B, dtype=torch.bool)
    first[2, 1] = first[4, 0] = True
    outs, final = core.unroll(x, state, first)
    ref_outs, ref_final = stepped(core, x, state, first)
    torch.testing.assert_close(outs, ref_outs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(final, ref_final, rtol=1e-6, atol=1e-6)
    plain, _ = core.unroll(x, state)
    # Row 2 never resets: exactly the unroll without flags. Rows 0 and 1 match it until their reset.
    assert torch.equal(outs[:, 2], plain[:, 2])
    assert torch.equal(outs[:2, 1], plain[:2, 1]) and torch.equal(outs[:4, 0], plain[:4, 0])
    # From its reset on, row 1 is an unroll of its steps from a zero state (the stored state forgotten).
    fresh, _ = core.unroll(x[2:], torch.zeros_like(state))
    torch.testing.assert_close(outs[2:, 1], fresh[:, 1], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(outs[2, 1], plain[2, 1])
    # A flag on step 0 ignores the state passed in.
    at_start = torch.zeros(T, B, dtype=torch.bool)
    at_start[0] = True
    zero_start, _ = core.unroll(x, torch.zeros_like(state))
    assert torch.equal(core.unroll(x, state, at_start)[0], zero_start)


def test_an_unknown_core_is_refused():
    with pytest.raises(ValueError, match="model.core"):
        RecurrentCore("rnn", F, C)
