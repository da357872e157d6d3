"""The check every algorithm's acting half passes: it acts with the module class its learner trains, and
with the learner's published weights its outputs are the learner network's (bit for bit through torch;
within float32 rounding where the method runs as its numpy program, `distrl.models.numpy_run`)."""
import numpy as np
import pytest
import torch

from distrl import tree
from distrl.models import as_input
from distrl.models.numpy_run import ATOL, RTOL


def _tensors(x):
    """An input as tensors: an array, or a tree of them (a structured or multi-agent observation)."""
    if x is None:
        return None
    return tree.map(as_input, x)


def _assert_equal(out, ref, exact: bool, where="output"):
    if isinstance(ref, dict):
        assert out.keys() == ref.keys(), where
        for k in ref:
            _assert_equal(out[k], ref[k], exact, f"{where}[{k!r}]")
    elif isinstance(ref, (tuple, list)):
        assert len(out) == len(ref), where
        for i, (o, r) in enumerate(zip(out, ref)):
            _assert_equal(o, r, exact, f"{where}[{i}]")
    else:
        assert isinstance(out, np.ndarray), where
        if exact:
            np.testing.assert_array_equal(out, ref.detach().numpy(), err_msg=where)
        else:
            np.testing.assert_allclose(out, ref.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=where)
        assert out.dtype == ref.detach().numpy().dtype, where


def check_acts_with_the_learners_network(policy, module: torch.nn.Module, weights: dict, method: str, *inputs):
    """`policy` holds a `type(module)`, refuses to act before weights, and after `set_weights(weights)` (the
    learner's `get_weights()`, whose network is `module`) `policy.run(method, *inputs)` is exactly
    `module.<method>(*inputs)`; weights with a renamed or a missing parameter are refused (strict load)."""
    assert type(policy.net) is type(module)
    with pytest.raises(RuntimeError, match="has no weights yet: call set_weights first"):
        policy.run(method, *inputs)
    own = policy.net.state_dict()
    assert own.keys() == weights.keys()
    assert any(not np.array_equal(own[k].numpy(), v) for k, v in weights.items()), "weights the policy had anyway"
    policy.set_weights(weights, 7)
    assert policy.version == 7
    out = policy.run(method, *inputs)
    with torch.no_grad():
        ref = getattr(module, method)(*(_tensors(x) for x in inputs))
    _assert_equal(out, ref, exact=policy.programs.get(method) is None)

    name = next(iter(weights))
    renamed = {("renamed_" + k if k == name else k): v for k, v in weights.items()}
    with pytest.raises(RuntimeError, match="Missing key.*" + name.replace(".", r"\.")):
        policy.set_weights(renamed, 8)
    missing = {k: v for k, v in weights.items() if k != name}
    with pytest.raises(RuntimeError, match="Missing key"):
        policy.set_weights(missing, 8)
    extra = dict(weights, extra_param=np.zeros(1, np.float32))
    with pytest.raises(RuntimeError, match="Unexpected key"):
        policy.set_weights(extra, 8)
    assert policy.version == 7  # none of them counted as a publication
