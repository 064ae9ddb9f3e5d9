"""Limits: connections, header and URL size, slow clients, body and tensor sizes, gRPC message size,
HTTP/2 floods (issue 19, points 3 and 4). After each attack the server answers a normal call."""
from __future__ import annotations

import socket
import ssl
import struct
import time

import grpc
import hpack
import pytest
import requests

from tests.serving.security import raw_h2 as h2
from tests.serving.security.clients import channel, code_of, predict, predict_request
from tests.serving.security.conftest import ALL_TOKEN, CLIENT_TIMEOUT_S, GRPC_MAX_MESSAGE

AUTH = {"Authorization": f"Bearer {ALL_TOKEN}"}
# How long a cut may take beyond --client_timeout_seconds on this shared 2-core machine.
SLACK_S = 6


def _rest_ok(server) -> None:
    answer = requests.post(server.base + "/v1/models/default:predict", json={"instances": [1.0, 2.0]},
                           headers=AUTH, timeout=10, **server.request_kwargs())
    assert answer.json() == {"predictions": [2.5, 3.0]}


def _grpc_ok(server, pki=None) -> None:
    with channel(server, client_pems=pki.client_pems if pki else None) as chan:
        assert predict(chan, ALL_TOKEN) == [2.5, 3.0]


def _tls(server, alpn: str | None = None, client: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=server.pki.ca_file)
    if client:
        context.load_cert_chain(*server.pki.client_cert)
    if alpn:
        context.set_alpn_protocols([alpn])
    return context


def _read_all(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything until the server closes, and when it did."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except (ConnectionResetError, ssl.SSLError):
        pass
    return data, time.monotonic()


# ---- REST sizes ---------------------------------------------------------------------------------------
def test_rest_url_too_long(secure):
    answer = requests.get(secure.base + "/v1/models/" + "a" * 3000, headers=AUTH, timeout=10,
                          **secure.request_kwargs())
    assert answer.status_code == 414 and "error" in answer.json()
    _rest_ok(secure)


def test_rest_headers_too_large(secure):
    answer = requests.get(secure.base + "/v1/models/default", headers={**AUTH, "X-Filler": "b" * 9000}, timeout=10,
                          **secure.request_kwargs())
    assert answer.status_code == 431 and "error" in answer.json()
    _rest_ok(secure)


def test_rest_declared_gigabyte_body_refused_at_once(plain):
    # 1 GB announced, one byte sent: 413 comes from the headers alone.
    with socket.create_connection(("127.0.0.1", plain.rest_port), timeout=10) as sock:
        sock.sendall(b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000\r\n\r\n{")
        answer, _ = _read_all(sock, 10)
    assert answer.startswith(b"HTTP/1.1 413 ") and b"--rest_api_max_body_bytes" in answer
    _rest_ok(plain)


# ---- slow clients -----------------------------------------------------------------------------------------
def test_rest_slowloris_is_cut(secure):
    request = (b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ALL_TOKEN.encode()
               + b"\r\nContent-Length: 20\r\n\r\n{\"instances\": [1.0]}")
    with socket.create_connection(("127.0.0.1", secure.rest_port), timeout=10) as raw:
        with _tls(secure).wrap_socket(raw, server_hostname="localhost") as sock:
            started = time.monotonic()
            sock.settimeout(0.5)
            closed_after, answer = None, b""
            for byte in request:  # one byte every half second: the request would take 60 s
                try:
                    sock.sendall(bytes([byte]))
                    chunk = sock.recv(4096)
                    answer += chunk
                    if not chunk:
                        closed_after = time.monotonic() - started
                        break
                except socket.timeout:
                    _rest_ok(secure)  # others are answered meanwhile
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    closed_after = time.monotonic() - started
                    break
            assert closed_after is not None and closed_after < CLIENT_TIMEOUT_S + SLACK_S
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408 ")
    _rest_ok(secure)


@pytest.mark.parametrize("port", ["rest_port", "grpc_port"])
def test_idle_connection_is_closed(secure, port):
    with socket.create_connection(("127.0.0.1", getattr(secure, port)), timeout=10) as raw:
        with _tls(secure, "h2" if port == "grpc_port" else None).wrap_socket(raw, server_hostname="localhost") as sock:
            started = time.monotonic()
            _, closed = _read_all(sock, CLIENT_TIMEOUT_S + SLACK_S)
            assert closed - started < CLIENT_TIMEOUT_S + SLACK_S


def test_grpc_trickled_call_is_cut(secure):
    encoder = hpack.Encoder()
    with h2.connect(secure, _tls(secure, "h2")) as sock:
        headers = h2.request_headers(encoder, extra=[("authorization", f"Bearer {ALL_TOKEN}")])
        sock.sendall(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0) + h2.frame(h2.HEADERS, h2.END_HEADERS, 1, headers)
                     + h2.frame(h2.DATA, 0, 1, b"\x00"))  # 1 byte of the 5-byte message prefix, then nothing
        started = time.monotonic()
        frames = h2.read_frames(sock, until_closed=False, timeout=CLIENT_TIMEOUT_S + SLACK_S)
        assert time.monotonic() - started < CLIENT_TIMEOUT_S + SLACK_S
    blocks = [hpack.Decoder().decode(p) for kind, _f, sid, p in frames if kind == h2.HEADERS and sid == 1]
    assert blocks and dict(blocks[0]).get("grpc-status") == "4"  # DEADLINE_EXCEEDED
    _grpc_ok(secure)


# ---- connections ------------------------------------------------------------------------------------------
def test_max_connections(mtls):
    def connect(port: int, alpn=None) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        return _tls(mtls, alpn, client=True).wrap_socket(raw, server_hostname="localhost")

    time.sleep(0.5)  # earlier tests' connections finish closing
    held = [connect(mtls.rest_port) for _ in range(4)]
    try:
        extra = connect(mtls.rest_port)
        answer, _ = _read_all(extra, 10)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503 ") and b"too many connections" in answer
    finally:
        for sock in held:
            sock.close()
    held = [connect(mtls.grpc_port, "h2") for _ in range(4)]
    try:
        extra = connect(mtls.grpc_port, "h2")
        assert h2.goaway_code(h2.read_frames(extra)) == h2.ENHANCE_YOUR_CALM
        extra.close()
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.5)
    answer = requests.post(mtls.base + "/v1/models/default:predict", json={"instances": [1.0, 2.0]}, timeout=10,
                           **mtls.request_kwargs())
    assert answer.status_code == 200
    _grpc_ok(mtls, mtls.pki)


# ---- tensor and message sizes -------------------------------------------------------------------------------
def _huge_shape_request(dtype: int, value_field: str, value):
    request = predict_request()
    tensor = request.inputs["x"]
    tensor.Clear()
    tensor.dtype = dtype
    tensor.tensor_shape.dim.add(size=10**9)
    getattr(tensor, value_field).append(value)
    return request


@pytest.mark.parametrize("name", ["plain", "grpcio_secure"])
def test_declared_billion_element_shape_refused_before_allocation(servers, pki, name):
    server = servers[name]
    with channel(server, client_pems=pki.client_pems) as chan:
        for request in (_huge_shape_request(1, "float_val", 1.0), _huge_shape_request(7, "string_val", b"a")):
            assert len(request.SerializeToString()) < 64
            with pytest.raises(grpc.RpcError) as refused:
                predict(chan, ALL_TOKEN, request)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max_decoded_tensor_bytes" in refused.value.details()
        assert predict(chan, ALL_TOKEN) == [2.5, 3.0]


def test_rest_deeply_nested_body_is_a_400(plain):
    for depth in (1000, 100_000):
        body = b'{"instances": ' + b"[" * depth + b"1" + b"]" * depth + b"}"
        answer = requests.post(plain.base + "/v1/models/default:predict", data=body, timeout=30)
        assert answer.status_code == 400 and "error" in answer.json()
    _rest_ok(plain)


def test_grpc_message_size_limit(secure):
    with channel(secure) as chan:
        request = predict_request([1.0] * (GRPC_MAX_MESSAGE // 4 + 1000))
        assert code_of(lambda: predict(chan, ALL_TOKEN, request)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert predict(chan, ALL_TOKEN) == [2.5, 3.0]


# ---- HTTP/2 floods (always on: the plain server) --------------------------------------------------------------
def _flood(server, build) -> list:
    encoder = hpack.Encoder()
    with h2.connect(server) as sock:
        h2.send_all(sock, h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0) + build(encoder))
        return h2.read_frames(sock)


def _rapid_reset(encoder) -> bytes:
    out = []
    for i in range(3000):
        sid = 2 * i + 1
        out.append(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, h2.request_headers(encoder)))
        out.append(h2.frame(h2.RST_STREAM, 0, sid, struct.pack(">L", 8)))
    return b"".join(out)


def _continuation_flood(encoder) -> bytes:
    return h2.frame(h2.HEADERS, 0, 1, h2.request_headers(encoder)) + h2.frame(h2.CONTINUATION, 0, 1) * 20000


FLOODS = {
    "rapid reset": _rapid_reset,
    "CONTINUATION": _continuation_flood,
    "SETTINGS": lambda _e: h2.frame(h2.SETTINGS, 0, 0) * 20000,
    "PING": lambda _e: h2.frame(h2.PING, 0, 0, b"12345678") * 20000,
    "empty DATA": lambda e: (h2.frame(h2.HEADERS, h2.END_HEADERS, 1, h2.request_headers(e))
                             + h2.frame(h2.DATA, 0, 1) * 20000),
}


def _goaway_last_stream(frames) -> int:
    return next(struct.unpack(">L", payload[:4])[0] & 0x7FFFFFFF
                for kind, _flags, _sid, payload in frames if kind == h2.GOAWAY)


def test_rapid_reset_is_cut_within_its_first_few_hundred_streams(plain):
    # The cancellations' own budget (a burst of 100) cuts the attacker long before the 1,000 control
    # frames of the general budget: the GOAWAY names the last stream the server took.
    frames = _flood(plain, _rapid_reset)
    assert h2.goaway_code(frames) == h2.ENHANCE_YOUR_CALM
    assert _goaway_last_stream(frames) < 2 * 200


def test_a_client_cancelling_some_calls_keeps_its_connection(plain):
    encoder = hpack.Encoder()
    cancels = b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS, 2 * i + 1, h2.request_headers(encoder))
                       + h2.frame(h2.RST_STREAM, 0, 2 * i + 1, struct.pack(">L", 8)) for i in range(60))
    with h2.connect(plain) as sock:
        h2.send_all(sock, h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0) + cancels + h2.frame(h2.PING, 0, 0, b"still-up"))
        frames = h2.read_frames(sock, until_closed=False, timeout=3)
    assert h2.goaway_code(frames) is None
    assert any(kind == h2.PING and payload == b"still-up" for kind, _f, _s, payload in frames)


@pytest.mark.parametrize("attack", list(FLOODS))
def test_http2_flood_gets_goaway_enhance_your_calm(plain, attack):
    frames = _flood(plain, FLOODS[attack])
    assert h2.goaway_code(frames) == h2.ENHANCE_YOUR_CALM
    started = time.monotonic()
    _grpc_ok(plain)
    assert time.monotonic() - started < 10  # answered, not stuck behind the attack
