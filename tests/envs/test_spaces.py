"""Spaces as plain data (`distrl.envs.spaces`): a config's declaration, and the wire's, JSON-safe; Dict and
Tuple ones nested, with MultiDiscrete and MultiBinary leaves and a mask, read on the wire's two sides
(`distrl.client.spaces`)."""
import json

import numpy as np
import pytest
from gymnasium import spaces

from distrl.client import spaces as wire_spaces
from distrl.envs.spaces import mask_problem, same_space, space_from_data, space_to_data
from distrl.tree import named_leaves

NESTED = spaces.Dict({
    "image": spaces.Box(0, 255, (3, 3, 1), np.uint8),
    "sensors": spaces.Tuple([spaces.Discrete(4, start=1), spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[0, 1], [2, 3]]),
                             spaces.Dict({"bits": spaces.MultiBinary([2, 2]), "speed": spaces.Box(-1, 1, (1,))})]),
    "action_mask": spaces.MultiBinary(5)})


@pytest.mark.parametrize("space", [spaces.Discrete(5), spaces.Box(-np.inf, np.inf, (4,), np.float32),
                                   spaces.Box(0, 255, (10, 10, 4), np.uint8),
                                   spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, np.inf], np.float32)),
                                   spaces.Discrete(3, start=-1), spaces.MultiDiscrete([3, 4]),
                                   spaces.MultiDiscrete([[2, 3], [4, 5]], np.int32, start=[[0, 1], [2, 3]]),
                                   spaces.MultiBinary(6), spaces.MultiBinary([2, 3]),
                                   spaces.Tuple([spaces.Discrete(2), spaces.Box(-1, 1, (2,))]), NESTED])
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
    ({"n": 2, "shape": [1]}, "takes ['n', 'start']"), ({"n": True}, "'k.n'"), ({"shape": [2], "low": "lots"}, "'k.low'"),
])
def test_a_bad_declaration_names_its_key(data, message):
    with pytest.raises(ValueError, match=None) as e:
        space_from_data(data, "k")
    assert message in str(e.value)


def test_observation_bounds_may_differ_action_bounds_may_not():
    a, b = spaces.Box(-1, 1, (2,), np.float32), spaces.Box(-2, 2, (2,), np.float32)
    assert same_space(a, b, bounds=False) and not same_space(a, b, bounds=True)
    assert not same_space(spaces.Discrete(2), a, bounds=False)


def test_protocol_1_spaces_are_written_as_protocol_1_wrote_them():
    assert space_to_data(spaces.Discrete(2)) == {"type": "discrete", "n": 2}
    assert space_to_data(spaces.Box(-1, 1, (2,), np.float32)) == {"type": "box", "shape": [2], "dtype": "float32",
                                                                   "low": -1.0, "high": 1.0}
    assert wire_spaces.protocol_for(space_to_data(spaces.Discrete(2)), space_to_data(spaces.Box(-1, 1, (2,)))) == 1
    for space in (NESTED, spaces.MultiDiscrete([3]), spaces.MultiBinary(2), spaces.Discrete(2, start=1)):
        assert wire_spaces.protocol_for(space_to_data(space)) == 2


def test_a_nested_declaration_parses_from_yaml_like_data():
    d = {"type": "dict", "spaces": {
        "pos": {"shape": [2], "low": -1, "high": 1},
        "items": {"type": "tuple", "spaces": [{"n": 3}, {"type": "multi_discrete", "nvec": [2, 2], "start": 1}]},
        "action_mask": {"type": "multi_binary", "n": 4}}}
    space = space_from_data(d, "k")
    assert space == spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "action_mask": spaces.MultiBinary(4),
                                 "items": spaces.Tuple([spaces.Discrete(3), spaces.MultiDiscrete([2, 2], start=[1, 1])])})
    assert mask_problem(space, spaces.MultiDiscrete([2, 2])) is None and mask_problem(space, spaces.Discrete(4)) is None
    assert "a multi_binary of 3" in mask_problem(space, spaces.Discrete(3))
    assert "masks Discrete, MultiDiscrete or MultiBinary actions" in mask_problem(space, spaces.Box(-1, 1, (4,)))


@pytest.mark.parametrize("data, message", [
    ({"type": "dict", "spaces": {}}, "'k.spaces': a mapping"),
    ({"type": "dict", "spaces": {"a.b": {"n": 2}}}, "without '.' or '#'"),
    ({"type": "dict", "spaces": {"a": {"type": "box", "shape": [0]}}}, "'k.spaces.a.shape'"),
    ({"type": "tuple", "spaces": [{"n": 2}, {"type": "cube"}]}, "'k.spaces.1.type'"),
    ({"type": "tuple", "spaces": {"n": 2}}, "'k.spaces': a list of spaces"),
    ({"type": "multi_discrete", "nvec": [3, 0]}, "'k.nvec'"), ({"type": "multi_discrete", "nvec": [[3], [3, 4]]}, "'k.nvec'"),
    ({"type": "multi_discrete", "nvec": [3, 4], "start": [1, 2, 3]}, "'k.start'"),
    ({"type": "multi_discrete", "nvec": [3], "dtype": "float32"}, "'k.dtype'"),
    ({"type": "multi_binary", "n": 0}, "'k.n'"), ({"type": "multi_binary", "n": [2, "x"]}, "'k.n'"),
    ({"type": "multi_binary", "n": 2, "nvec": [2]}, "takes ['n'], not ['nvec']"),
    ({"n": 2, "start": 0.5}, "'k.start'"),
])
def test_a_bad_structured_declaration_names_its_nested_key(data, message):
    with pytest.raises(ValueError) as e:
        space_from_data(data, "k")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_actions_are_leaves_and_discrete_ones_start_at_0():
    with pytest.raises(ValueError, match="'k.type': one of discrete, box, multi_discrete, multi_binary, got 'dict'"):
        space_from_data({"type": "dict", "spaces": {"a": {"n": 2}}}, "k", action=True)
    with pytest.raises(ValueError, match=r"a discrete space takes \['n'\], not \['start'\]"):
        space_from_data({"n": 2, "start": 1}, "k", action=True)
    assert space_from_data({"type": "multi_discrete", "nvec": [2], "start": 1}, "k", action=True).start.tolist() == [1]


def test_structures_agree_by_keys_and_leaves():
    same = space_from_data(space_to_data(NESTED), "k")
    assert same_space(same, NESTED, bounds=True)
    other = spaces.Dict({**NESTED.spaces, "action_mask": spaces.MultiBinary(4)})
    assert not same_space(other, NESTED, bounds=False)
    assert not same_space(spaces.Tuple([spaces.Discrete(2)]), spaces.Tuple([spaces.Discrete(2)] * 2), bounds=False)
    assert not same_space(spaces.MultiDiscrete([2, 3]), spaces.MultiDiscrete([2, 4]), bounds=False)
    assert not same_space(spaces.MultiBinary(4), spaces.MultiDiscrete([2] * 4), bounds=False)


def test_the_wire_names_leaves_as_the_tree_and_the_onnx_inputs_do():
    data = space_to_data(NESTED)
    names = [n for n, _ in wire_spaces.leaf_spaces(data)]
    sample = NESTED.sample()
    assert sorted(names) == sorted(n for n, _ in named_leaves(sample))
    assert names == ["action_mask", "image", "sensors.0", "sensors.1", "sensors.2.bits", "sensors.2.speed"]
    shapes = {n: wire_spaces.leaf_shape(s) for n, s in wire_spaces.leaf_spaces(data)}
    assert shapes == {"action_mask": (5,), "image": (3, 3, 1), "sensors.0": (), "sensors.1": (2, 2),
                      "sensors.2.bits": (2, 2), "sensors.2.speed": (1,)}
    low, high = wire_spaces.leaf_range(data["spaces"]["sensors"]["spaces"][1])
    assert low.tolist() == [[0, 1], [2, 3]] and high.tolist() == [[2, 4], [6, 8]]
    read = wire_spaces.read(data, json.loads(json.dumps(sample, default=lambda a: np.asarray(a).tolist())),
                            lambda name, space, v: np.asarray(v, wire_spaces.leaf_dtype(space)))
    assert isinstance(read["sensors"], tuple) and read["sensors"][2]["bits"].dtype == np.int8
    leaves = dict(named_leaves(read))
    assert wire_spaces.nest(data, leaves)["sensors"][1] is leaves["sensors.1"]
    for bad, message in (({**sample, "extra": 1}, "keys"), ({k: v for k, v in sample.items() if k != "image"}, "keys"),
                         ({**sample, "sensors": list(sample["sensors"])[:2]}, "'sensors' is a list of 3 values")):
        with pytest.raises(ValueError, match=message):
            wire_spaces.read(data, bad, lambda *a: None)
