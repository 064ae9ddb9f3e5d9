"""Protobuf's wire format, the few pieces the hand-written responses need (predict_response, v2_grpc).

A varint, a field key (field number and wire type) and a length-delimited field: enough to write
a message whose layout is fixed, byte for byte what the generated message's SerializeToString
gives (the callers' tests compare them).
"""
from __future__ import annotations

VARINT = 0  # wire types
LEN = 2  # length-delimited: strings, bytes, packed arrays, sub-messages


def varint(n: int) -> bytes:
    """An int64 as a protobuf varint (a negative one as its 64-bit two's complement, as protobuf does)."""
    if 0 <= n < 0x80:
        return bytes((n,))
    n &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes, a packed array or a sub-message."""
    return key(field, LEN) + varint(len(payload)) + payload
