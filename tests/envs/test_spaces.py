"""Spaces as plain data (`distrl.envs.spaces`): a config's declaration, and the wire's, JSON-safe."""
import json

import numpy as np
import pytest
from gymnasium import spaces

from distrl.envs.spaces import same_space, space_from_data, space_to_data


@pytest.mark.parametrize("space", [spaces.Discrete(5), spaces.Box(-np.inf, np.inf, (4,), np.float32),
                                   spaces.Box(0, 255, (10, 10, 4), np.uint8),
                                   spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, np.inf], np.float32))])
def test_a_space_survives_json(space):
    back = space_from_data(json.loads(json.dumps(space_to_data(space), allow_nan=False)), "x")
    assert same_space(back, space, bounds=True) and back == space


def test_a_declaration_takes_scalars_yaml_infinities_and_defaults():
    box = space_from_data({"shape": [2, 3], "low": -1, "high": float("inf")}, "k")
    assert box.shape == (2, 3) and box.dtype == np.float32 and (box.low == -1).all() and np.isinf(box.high).all()
    frames = space_from_data({"type": "box", "shape": [4, 4], "dtype": "uint8"}, "k")
    assert frames.low.min() == 0 and frames.high.max() == 255  # unbounded ints: the dtype's range
    assert space_from_data({"n": 3}, "k") == spaces.Discrete(3)


@pytest.mark.parametrize("data, message", [
    ([4], "expected a mapping"), ({"type": "box"}, "'k.shape'"), ({"shape": [4], "dtype": "complex64"}, "'k.dtype'"),
    ({"shape": [2], "low": 1, "high": 0}, "low must not exceed high"), ({"shape": [2], "low": float("nan")}, "NaN"),
    ({"n": 2, "shape": [1]}, "takes ['n']"), ({"n": True}, "'k.n'"), ({"shape": [2], "low": "lots"}, "'k.low'"),
])
def test_a_bad_declaration_names_its_key(data, message):
    with pytest.raises(ValueError, match=None) as e:
        space_from_data(data, "k")
    assert message in str(e.value)


def test_observation_bounds_may_differ_action_bounds_may_not():
    a, b = spaces.Box(-1, 1, (2,), np.float32), spaces.Box(-2, 2, (2,), np.float32)
    assert same_space(a, b, bounds=False) and not same_space(a, b, bounds=True)
    assert not same_space(spaces.Discrete(2), a, bounds=False)
