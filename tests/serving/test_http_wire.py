"""HTTP/1.1 on the wire, with a raw socket: pipelining, 100-continue, chunked bodies, closing, big answers.

Every answer leaves through the loop's ``ResponseWriter`` (test_response_writer.py), so these
check that a connection's answers arrive whole and in order whatever path each one took.
"""
from __future__ import annotations

import json
import socket
import time

import pytest


def _connect(server, rcvbuf: int | None = None) -> socket.socket:
    host, port = server.base.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    if rcvbuf:  # before connecting: a small window makes the server's sends partial
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    return sock


def _request(method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: test\r\n{headers}"
    if body or method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _predict(values: list[float], headers: str = "") -> bytes:
    return _request("POST", "/v1/models/default:predict", json.dumps({"instances": values}).encode(), headers)


class _Reader:
    """Reads responses off one connection, one at a time."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 16)
        self.buffer += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict, bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"connection closed mid-head: {self.buffer!r}"
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers.get("content-length", 0))
        while len(self.buffer) < length:
            assert self._fill(), "connection closed mid-body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def at_eof(self) -> bool:
        return not self.buffer and not self._fill()


def test_pipelined_requests_are_answered_in_order(testdata_server):
    values = [float(i) for i in range(2000)]
    with _connect(testdata_server) as sock:
        sock.sendall(_predict([1.0]) + _request("GET", "/v1/models/nosuchmodel") + _predict(values)
                     + _request("GET", "/v1/models/default") + _predict([3.0, 4.0])
                     + _request("POST", "/v1/models/default:predict", b"{not json"))
        reader = _Reader(sock)
        answers = [reader.response() for _ in range(6)]
    assert [status for status, _, _ in answers] == [200, 404, 200, 200, 200, 400]
    assert json.loads(answers[0][2]) == {"predictions": [2.5]}
    assert "nosuchmodel" in json.loads(answers[1][2])["error"]
    assert json.loads(answers[2][2]) == {"predictions": [v / 2 + 2 for v in values]}
    assert json.loads(answers[3][2])["model_version_status"][0]["state"] == "AVAILABLE"
    assert json.loads(answers[4][2]) == {"predictions": [3.5, 4.0]}
    assert "error" in json.loads(answers[5][2])


def test_answers_past_what_the_socket_takes_arrive_whole_and_in_order(testdata_server):
    """A client that reads nothing until it has sent everything: the later answers meet a full
    socket, and what the socket does not take continues through the transport, in order."""
    values = [float(i % 1000) + 0.25 for i in range(12000)]
    requests = [_predict(values[k:] + values[:k]) for k in range(0, 48 * 250, 250)]
    with _connect(testdata_server, rcvbuf=4096) as sock:
        sock.sendall(b"".join(requests))
        time.sleep(0.5)  # let the server's sends fill the socket before reading
        reader = _Reader(sock)
        answers = [reader.response() for _ in requests]
    # Loopback takes ~3 MB before a send comes back short: the answers must add up to more.
    assert sum(len(body) for _, _, body in answers) > 4_000_000
    for k, (status, _, body) in zip(range(0, 48 * 250, 250), answers):
        assert status == 200 and json.loads(body) == {"predictions": [v / 2 + 2 for v in values[k:] + values[:k]]}


def test_expect_100_continue(testdata_server):
    body = json.dumps({"instances": [6.0]}).encode()
    with _connect(testdata_server) as sock:
        sock.sendall(_request("POST", "/v1/models/default:predict", b"", "Expect: 100-continue\r\n")
                     .replace(b"Content-Length: 0", b"Content-Length: %d" % len(body)))
        reader = _Reader(sock)
        status, _, _ = reader.response()
        assert status == 100
        sock.sendall(body)
        status, _, answer = reader.response()
    assert status == 200 and json.loads(answer) == {"predictions": [5.0]}


def test_chunked_request_body(testdata_server):
    body = json.dumps({"instances": [2.0, 8.0]}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:5], body[5:])) + b"0\r\n\r\n"
    with _connect(testdata_server) as sock:
        sock.sendall(b"POST /v1/models/default:predict HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunks)
        status, _, answer = _Reader(sock).response()
    assert status == 200 and json.loads(answer) == {"predictions": [3.0, 6.0]}


@pytest.mark.parametrize("last", [_predict([1.0], "Connection: close\r\n"),
                                  _request("GET", "/v1/models/default", headers="Connection: close\r\n")],
                         ids=["predict", "status"])
def test_connection_close_answers_then_closes(testdata_server, last):
    with _connect(testdata_server) as sock:
        sock.sendall(_predict([0.0]) + last)
        reader = _Reader(sock)
        first, second = reader.response(), reader.response()
        assert reader.at_eof(), "the server closes after the answer it was asked to close on"
    assert first[0] == 200 and json.loads(first[2]) == {"predictions": [2.0]}
    assert second[0] == 200 and second[1].get("connection") == "close"


def test_malformed_http_gets_400_then_close_and_the_server_goes_on(testdata_server):
    with _connect(testdata_server) as sock:
        sock.sendall(_predict([1.0]) + b"NOT HTTP AT ALL\r\n\r\n")
        reader = _Reader(sock)
        good, bad = reader.response(), reader.response()
        assert reader.at_eof()
    assert good[0] == 200 and json.loads(good[2]) == {"predictions": [2.5]}
    assert bad[0] == 400 and "malformed HTTP request" in json.loads(bad[2])["error"]
    with _connect(testdata_server) as sock:
        sock.sendall(_predict([4.0]))
        assert json.loads(_Reader(sock).response()[2]) == {"predictions": [4.0]}


def test_a_client_that_half_closes_after_its_request_still_gets_the_answer(testdata_server):
    """FIN right behind a predict: the server answers, then closes. (Whether the FIN is read before the
    pass's answers leave depends on timing; test_response_writer checks that case's hand-over.)"""
    for _ in range(20):
        with _connect(testdata_server) as sock:
            sock.sendall(_predict([8.0]))
            sock.shutdown(socket.SHUT_WR)
            reader = _Reader(sock)
            status, _, answer = reader.response()
            assert status == 200 and json.loads(answer) == {"predictions": [6.0]}
            assert reader.at_eof()
