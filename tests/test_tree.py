"""distrl.tree: one set of operations for flat and structured observations alike."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl import tree

SPACE = spaces.Dict({"image": spaces.Box(0, 255, (3, 4, 4), np.uint8), "direction": spaces.Discrete(4),
                     "pos": spaces.Tuple((spaces.Box(-1, 1, (2,), np.float32), spaces.MultiBinary(3)))})


def test_a_flat_array_is_a_tree_of_one_leaf():
    a = np.arange(6.0).reshape(3, 2)
    assert tree.rows(a) == 3 and tree.leaves(a)[0] is a
    assert np.array_equal(tree.index(a, 1), a[1])
    assert np.array_equal(tree.concatenate([a, a]), np.concatenate([a, a]))
    assert tree.structure_text(a) == "array" and tree.mask_of(a) is None


def test_stack_index_assign_and_flatten_keep_the_structure():
    rows = [tree.as_stored(SPACE, SPACE.sample()) for _ in range(4)]
    batch = tree.stack(rows)
    assert batch["image"].shape == (4, 3, 4, 4) and batch["direction"].dtype == np.int64
    assert batch["pos"][1].dtype == np.int8 and batch["pos"][0].shape == (4, 2)
    out = tree.empty((2, 4), rows[0])
    tree.assign(out, 1, batch)
    assert np.array_equal(tree.index(out, 1)["image"], batch["image"])
    flat = tree.flatten_lead(out, 2)
    assert flat["pos"][0].shape == (8, 2) and tree.rows(flat) == 8
    assert [n for n, _ in tree.named_leaves(batch)] == ["direction", "image", "pos.0", "pos.1"]
    assert [n for n, _ in tree.leaf_spaces(SPACE)] == ["direction", "image", "pos.0", "pos.1"]


def test_tensors_map_like_arrays():
    batch = tree.sample(SPACE, 5)
    t = tree.map(torch.as_tensor, batch)
    assert tree.index(t, torch.tensor([0, 2]))["image"].shape == (2, 3, 4, 4)


def test_all_finite_looks_at_float_leaves():
    batch = tree.sample(SPACE, 2)
    assert tree.all_finite(batch)
    batch["pos"][0][1, 0] = np.nan
    assert not tree.all_finite(batch)
    assert not tree.all_finite(np.array([np.inf]))


def test_an_observation_with_other_keys_than_its_space_is_named():
    obs = tree.as_stored(SPACE, SPACE.sample())
    del obs["direction"]
    with pytest.raises(ValueError, match=r"keys \['image', 'pos'\], where the space has \['direction', 'image', 'pos'\]"):
        tree.as_stored(SPACE, obs)


def test_leaves_no_network_takes_are_named():
    assert tree.leaf_problem(spaces.Text(5)) == "a Text, which gives no arrays a network takes"
    assert tree.leaf_problem(spaces.Discrete(3)) is None


def test_a_mask_joins_a_dicts_keys_and_sits_beside_any_other_tree():
    mask, a, pair = np.ones((2, 3), np.int8), np.zeros((2, 4)), (np.zeros(2), np.ones(2))
    joined = tree.with_mask({"x": a}, mask)
    assert list(joined) == ["x", "action_mask"] and joined["x"] is a and tree.mask_of(joined) is mask
    for other in (a, pair):
        beside = tree.with_mask(other, mask)
        assert list(beside) == ["obs", "action_mask"] and beside["obs"] is other and tree.mask_of(beside) is mask
