"""The simulator protocol's wire format (docs/reference/protocol.md): frames, their two encodings, arrays.

A frame is a 4-byte big-endian unsigned length, then that many bytes of payload: one message, a JSON
object (UTF-8) or a msgpack map. A connection speaks the encoding of its first frame: JSON when its
payload starts with `{`, msgpack otherwise. An array is a number, a nested list of numbers, or an array
object `{"dtype", "shape", "data"}` holding the raw little-endian bytes in C order (a base64 string in
JSON). Standard library, numpy and msgpack only: a simulator imports this without torch or Ray.
"""
from __future__ import annotations

import base64
import json
import socket
import struct
from typing import Any

import msgpack
import numpy as np

PROTOCOL = 2  # the newest version, which clients say; a server speaks every one of PROTOCOLS
PROTOCOLS = (1, 2)
HEADER = struct.Struct(">I")
MAX_MESSAGE_BYTES = 16 * 2**20  # the server's default limit on one frame's payload (it says its own in `welcome`)
DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", "float16", "float32", "float64")
ENCODINGS = ("msgpack", "json")


class ProtocolError(Exception):
    """A message that breaks the protocol: `code` is the error code the server replies with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def encode(msg: dict, encoding: str) -> bytes:
    """A message's payload in `encoding` (its bytes already base64 strings for JSON: `pack_array`)."""
    if encoding == "json":
        return json.dumps(msg, allow_nan=False, separators=(",", ":")).encode()
    return msgpack.packb(msg, use_bin_type=True)


def decode(payload: bytes) -> tuple[dict, str]:
    """(message, its encoding); ProtocolError("malformed") for anything but an encoded map."""
    encoding = "json" if payload[:1] == b"{" else "msgpack"
    try:
        msg = json.loads(payload, parse_constant=_not_json) if encoding == "json" else msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, RecursionError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError, UnicodeDecodeError) as e:
        raise ProtocolError("malformed", f"not a {encoding} message: {str(e)[:120]}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("malformed", f"a message is a {encoding} map, got a {type(msg).__name__}")
    return msg, encoding


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def pack_array(a: np.ndarray, encoding: str) -> dict:
    """An array object for `a` (bytes in msgpack, base64 in JSON)."""
    a = np.asarray(a, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
    data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    return {"dtype": a.dtype.name, "shape": list(a.shape),
            "data": base64.b64encode(data).decode() if encoding == "json" else data}


def unpack_array(value: Any, dtype: np.dtype | None = None) -> np.ndarray:
    """An array from a number, nested lists, or an array object; cast to `dtype` when given.
    ProtocolError("bad_value") for anything else."""
    if isinstance(value, dict):
        try:
            kind, shape, data = value["dtype"], [int(n) for n in value["shape"]], value["data"]
            if kind not in DTYPES or any(n < 0 for n in shape):
                raise ValueError(f"dtype {kind!r}, shape {shape}")
            if isinstance(data, str):
                raw = base64.b64decode(data, validate=True)
            elif isinstance(data, (bytes, bytearray)):
                raw = data
            else:
                raise TypeError(f"data is a {type(data).__name__}")
            a = np.frombuffer(raw, np.dtype(kind).newbyteorder("<")).reshape(shape)
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError("bad_value", f"not an array object: {str(e)[:120]}") from None
        a = a.astype(a.dtype.newbyteorder("="), copy=False)
    else:
        try:
            a = np.asarray(value)
        except (ValueError, TypeError) as e:
            raise ProtocolError("bad_value", f"not an array: {str(e)[:120]}") from None
        if a.dtype.kind not in "biuf":
            raise ProtocolError("bad_value", f"an array holds numbers, got {a.dtype} values")
    if dtype is not None and a.dtype != dtype:
        a = a.astype(dtype)
    return a


def send(sock: socket.socket, msg: dict, encoding: str) -> None:
    sock.sendall(frame(encode(msg, encoding)))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("the server closed the connection")
        got += k
    return bytes(buf)


def receive(sock: socket.socket, max_bytes: int = MAX_MESSAGE_BYTES * 8) -> dict:
    """The next message on a blocking socket (ConnectionError when it closes)."""
    (n,) = HEADER.unpack(_recv_exactly(sock, HEADER.size))
    if n > max_bytes:
        raise ProtocolError("too_large", f"a frame of {n} bytes")
    return decode(_recv_exactly(sock, n))[0]
