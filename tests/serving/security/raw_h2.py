"""A raw HTTP/2 peer for attacks the stock clients never make (floods, trickles), built on sockets,
``struct`` and the ``hpack`` encoder, independent of the server's own frame code."""
from __future__ import annotations

import socket
import ssl
import struct

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, END_HEADERS = 0x1, 0x4
ENHANCE_YOUR_CALM = 0xB
PREDICT_PATH = "/tensorflow.serving.PredictionService/Predict"


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">HBBBL", n >> 8, n & 0xFF, kind, flags, sid) + payload


def request_headers(encoder: hpack.Encoder, path: str = PREDICT_PATH, extra=()) -> bytes:
    return encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                           (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"), *extra])


def connect(server, tls_context: ssl.SSLContext | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10)
    if tls_context is not None:
        sock = tls_context.wrap_socket(sock, server_hostname="localhost")
    return sock


def read_frames(sock: socket.socket, until_closed: bool = True, timeout: float = 10.0):
    """Frames the server sends as (type, flags, stream id, payload), until it closes (or ``timeout``)."""
    sock.settimeout(timeout)
    buffer, frames = b"", []
    while True:
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionResetError, ssl.SSLError):
            break
        if not chunk:
            break
        buffer += chunk
        while len(buffer) >= 9:
            hi, lo, kind, flags, sid = struct.unpack_from(">HBBBL", buffer)
            length = hi << 8 | lo
            if len(buffer) < 9 + length:
                break
            frames.append((kind, flags, sid & 0x7FFFFFFF, buffer[9: 9 + length]))
            buffer = buffer[9 + length:]
        if not until_closed and any(f[0] == HEADERS for f in frames):
            break
    return frames


def goaway_code(frames) -> int | None:
    for kind, _flags, _sid, payload in frames:
        if kind == GOAWAY:
            return struct.unpack(">LL", payload[:8])[1]
    return None


def send_all(sock: socket.socket, data: bytes) -> None:
    """Send, tolerating the server closing on us mid-flood (that is the point)."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
        pass
