"""The replay's store.npz encoding: any tree of JSON scalars and arrays comes back exactly."""
from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl.checkpoint import read, store_file


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**130, 2**130),
                    st.floats(allow_nan=False), st.text(max_size=5))
arrays = st.sampled_from([np.float32, np.int64, np.uint8, np.bool_, np.float16]).map(
    lambda t: np.arange(6).astype(t).reshape(2, 3))
trees = st.recursive(st.one_of(scalars, arrays, st.just(np.float64(2.5)), st.just(np.int32(-3))),
                     lambda c: st.one_of(st.lists(c, max_size=3),
                                         st.dictionaries(st.text("ab/", max_size=3), c, max_size=3)),
                     max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(trees)
def test_store_tree_encoding_is_exact(tree):
    skel, arrs = store_file.split_store(tree)
    back = read._join_store(json.loads(json.dumps(skel)), arrs, "store.npz")

    def same(a, b):
        assert type(a) is type(b)
        if isinstance(a, (np.ndarray, np.generic)):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        elif isinstance(a, dict):
            assert list(a) == list(b) and all(same(a[k], b[k]) is None for k in a)
        elif isinstance(a, list):
            assert len(a) == len(b) and all(same(x, y) is None for x, y in zip(a, b))
        else:
            assert a == b

    same(tree, back)
