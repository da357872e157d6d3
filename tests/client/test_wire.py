"""The wire format: frames, both encodings, arrays of every dtype, and malformed payloads refused."""
import json
import socket

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from distrl.client import wire
from distrl.client.wire import ProtocolError


@pytest.mark.parametrize("encoding", wire.ENCODINGS)
def test_a_message_round_trips_through_a_frame(encoding):
    a, b = socket.socketpair()
    msg = {"type": "get_action", "episode": "e1", "reward": 1.5,
           "obs": wire.pack_array(np.arange(6, dtype=np.float32).reshape(2, 3), encoding)}
    wire.send(a, msg, encoding)
    got = wire.receive(b)
    assert got["type"] == "get_action" and got["reward"] == 1.5
    np.testing.assert_array_equal(wire.unpack_array(got["obs"]), np.arange(6, dtype=np.float32).reshape(2, 3))
    a.close(), b.close()


def test_the_encoding_is_told_by_the_first_byte():
    assert wire.decode(b'{"type":"hello"}') == ({"type": "hello"}, "json")
    assert wire.decode(msgpack.packb({"type": "hello"})) == ({"type": "hello"}, "msgpack")


@pytest.mark.parametrize("payload", [b"{not json", b"\xc1", b"[1, 2]", msgpack.packb([1, 2]), msgpack.packb(3) + b"x",
                                     b"{" * 100_000])
def test_anything_but_an_encoded_map_is_malformed(payload):
    with pytest.raises(ProtocolError) as e:
        wire.decode(payload)
    assert e.value.code == "malformed"


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(st.sampled_from([np.dtype(d) for d in wire.DTYPES]), hnp.array_shapes(min_dims=0, max_dims=3)),
       st.sampled_from(wire.ENCODINGS))
def test_array_objects_keep_dtype_shape_and_values(a, encoding):
    packed = wire.decode(wire.encode({"a": wire.pack_array(a, encoding)}, encoding))[0]["a"]
    back = wire.unpack_array(packed)
    assert back.dtype == a.dtype and back.shape == a.shape
    np.testing.assert_array_equal(back, a)


def test_nested_lists_are_arrays_and_are_cast():
    a = wire.unpack_array(json.loads("[[1, 2], [3, 4]]"), np.dtype(np.float32))
    assert a.dtype == np.float32 and a.shape == (2, 2)


@pytest.mark.parametrize("value", [{"dtype": "object", "shape": [1], "data": b"x"}, {"dtype": "float32", "shape": [3],
                                   "data": b"\0" * 4}, {"dtype": "uint8", "shape": [2], "data": 10**12},
                                   {"dtype": "uint8", "shape": [-1], "data": b""}, {"shape": [1]}, ["a", "b"],
                                   [[1, 2], [3]], "text", None])
def test_what_is_no_array_is_a_bad_value(value):
    with pytest.raises(ProtocolError) as e:
        wire.unpack_array(value)
    assert e.value.code == "bad_value"
