"""HTTP/2 framing and HPACK glue for the lean gRPC server (``grpc_h2``).

Only what a cleartext (h2c, prior-knowledge) gRPC server needs: frame headers,
SETTINGS/WINDOW_UPDATE/RST_STREAM/GOAWAY builders, a caching HPACK decoder for
request headers, and header blocks for responses. Responses never use the HPACK
dynamic table (every field is a static-table reference or a literal "without
indexing"), so they are precomputed bytes, valid whatever the peer's table state.
Numbers are RFC 7540 (HTTP/2) and RFC 7541 (HPACK); gRPC's rules come from its
PROTOCOL-HTTP2 document.
"""
from __future__ import annotations

import struct
from urllib.parse import quote

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# SETTINGS identifiers.
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

# Error codes.
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = 2**31 - 1

# length (24 bits, as 16 + 8), type, flags, stream id (31 bits + reserved bit)
FRAME_HEADER = struct.Struct(">HBBBL")
_U32 = struct.Struct(">L")


class ConnectionError_(Exception):
    """A connection error (RFC 7540 §5.4.1): answer with GOAWAY(code) and close."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEADER.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def settings(pairs: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in pairs.items()))


SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">LL", last_stream_id, code) + debug)


# ---- HPACK: responses ----------------------------------------------------------------------------
def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A "literal header field without indexing, new name" (RFC 7541 §6.2.2), no Huffman coding."""
    return b"\x00" + _hpack_int(len(name), 7, 0) + name + _hpack_int(len(value), 7, 0) + value


# :status 200 is static entry 8; content-type a literal so the block needs no table state.
RESPONSE_HEADERS = b"\x88" + literal(b"content-type", b"application/grpc")


def percent_encode(message: str) -> bytes:
    """gRPC's grpc-message encoding: UTF-8, then %XX for bytes outside printable ASCII and '%'."""
    return quote(message, safe=" !\"#$&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`"
                 "abcdefghijklmnopqrstuvwxyz{|}~").encode("ascii")


def trailers(code: int, message: str = "") -> bytes:
    block = literal(b"grpc-status", str(int(code)).encode())
    if message:
        block += literal(b"grpc-message", percent_encode(message))
    return block


OK_TRAILERS = trailers(0)


# ---- HPACK: requests ------------------------------------------------------------------------------
class RequestHeaders:
    """What the gRPC server needs from a request's header block."""

    __slots__ = ("path", "timeout", "encoding", "content_type", "method", "authorization")

    def __init__(self, pairs: list[tuple[bytes, bytes]]):
        self.path = self.timeout = self.encoding = self.content_type = self.method = None
        self.authorization = None
        for name, value in pairs:
            if name == b":path":
                self.path = value.decode("latin-1")
            elif name == b"grpc-timeout":
                self.timeout = parse_timeout(value)
            elif name == b"grpc-encoding":
                self.encoding = value.decode("latin-1")
            elif name == b"content-type":
                self.content_type = value
            elif name == b":method":
                self.method = value
            elif name == b"authorization":
                self.authorization = value


_TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}


def parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout`` (1-8 digits and a unit, e.g. ``100m``) in seconds; None if malformed."""
    if 2 <= len(value) <= 9 and value[:-1].isdigit() and value[-1] in _TIMEOUT_UNITS:
        return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]
    return None


class HeaderDecoder:
    """An HPACK decoder that skips decoding for header blocks seen before.

    Clients repeat the same block for every call once their fields sit in the dynamic
    table (all "indexed" references). Such a block leaves the table unchanged, so its
    meaning is fixed until some other block changes the table: cache it until then.
    Every block still goes through the decoder when not cached, keeping the table in
    step with the peer's encoder.
    """

    _CACHE_LIMIT = 256

    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        self._table = self._decoder.header_table
        self._cache: dict[bytes, RequestHeaders] = {}

    def decode(self, block: bytes) -> RequestHeaders:
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        entries = self._table.dynamic_entries
        before = (len(entries), id(entries[0]) if entries else 0, self._table.maxsize)
        try:
            pairs = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:  # includes oversized header lists
            raise ConnectionError_(COMPRESSION_ERROR, f"HPACK: {exc}") from None
        headers = RequestHeaders(pairs)
        entries = self._table.dynamic_entries
        if (len(entries), id(entries[0]) if entries else 0, self._table.maxsize) == before:
            if len(self._cache) >= self._CACHE_LIMIT:
                self._cache.clear()
            self._cache[bytes(block)] = headers
        else:  # the table changed: cached blocks may now mean something else
            self._cache.clear()
        return headers
