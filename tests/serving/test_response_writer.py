"""The REST loop's writer: a pass's answers sent in one GIL-free call, each connection's bytes in order.

Unit tests drive ``ResponseWriter`` over real socket pairs (the kernel decides what a send
takes); the server's own use of it is covered by test_http_wire.py.
"""
from __future__ import annotations

import socket

import pytest

from modelyard.serving.transport import response_writer
from modelyard.serving.transport.response_writer import ResponseWriter

send_many = pytest.importorskip("modelyard.serving.transport._sendmany", reason="the C writer was not built (no C compiler)").send_many


class _Loop:
    def __init__(self):
        self.scheduled = []

    def call_soon(self, callback, *args):
        self.scheduled.append((callback, args))

    def run_pending(self):
        scheduled, self.scheduled = self.scheduled, []
        for callback, args in scheduled:
            callback(*args)


class _Transport:
    """What the writer needs of an asyncio transport; ``write`` records what the transport would queue."""

    def __init__(self, buffered: int = 0):
        self.queued: list[bytes] = []
        self.buffered = buffered
        self.closing = False

    def write(self, data: bytes) -> None:
        self.queued.append(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def rig(pair):
    """Socket pair (a writes, b reads), a loop whose passes the test runs, and the writer on it."""
    loop = _Loop()
    return pair[0], pair[1], loop, ResponseWriter(loop)


def _received(sock: socket.socket) -> bytes:
    sock.settimeout(0.5)
    chunks = []
    try:
        while chunk := sock.recv(1 << 20):
            chunks.append(chunk)
    except (TimeoutError, BlockingIOError):
        pass
    return b"".join(chunks)


def test_a_pass_goes_out_in_one_flush_in_order(rig):
    a, b, loop, writer = rig
    c, d = socket.socketpair()
    ta, tc = _Transport(), _Transport()
    writer.write(ta, a.fileno(), b"one ")
    writer.write(tc, c.fileno(), b"other")
    writer.write(ta, a.fileno(), b"two")
    assert len(loop.scheduled) == 1, "one flush per pass"
    assert _received(b) == b"", "nothing leaves before the pass ends"
    loop.run_pending()
    assert _received(b) == b"one two" and _received(d) == b"other"
    assert ta.queued == [] and tc.queued == [], "the sockets took everything: nothing for the transports"
    c.close()
    d.close()


def test_what_a_full_socket_does_not_take_goes_to_the_transport_in_order(rig):
    a, b, loop, writer = rig
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    transport = _Transport()
    data = bytes(range(256)) * 4096  # 1 MiB: far more than the socket takes
    writer.write(transport, a.fileno(), data[:1000])
    writer.write(transport, a.fileno(), data[1000:])
    loop.run_pending()
    taken = _received(b)
    assert 0 < len(taken) < len(data)
    assert taken + b"".join(transport.queued) == data, "the rest follows exactly where the socket stopped"


def test_a_connection_with_unsent_bytes_writes_through_its_transport(rig):
    a, b, loop, writer = rig
    transport = _Transport(buffered=10)
    writer.write(transport, a.fileno(), b"after the queued bytes")
    assert transport.queued == [b"after the queued bytes"] and loop.scheduled == []
    no_socket = _Transport()
    writer.write(no_socket, -1, b"x")
    assert no_socket.queued == [b"x"], "without a descriptor the transport writes"


def test_bytes_queued_before_the_transport_filled_wait_for_its_queue(rig):
    a, b, loop, writer = rig
    transport = _Transport()
    writer.write(transport, a.fileno(), b"first")
    transport.buffered = 5  # the transport queued bytes since (e.g. a 100 Continue written directly)
    loop.run_pending()
    assert transport.queued == [b"first"] and _received(b) == b""


def test_closing_sends_what_was_written_then_closes(rig):
    a, b, loop, writer = rig
    transport = _Transport()
    writer.write(transport, a.fileno(), b"last ")
    writer.write(transport, a.fileno(), b"answer")
    writer.close(transport)
    assert transport.queued == [b"last answer"] and transport.closing
    loop.run_pending()
    assert _received(b) == b"", "nothing is sent twice"


def test_a_gone_or_closing_connection_is_never_written(rig):
    a, b, loop, writer = rig
    gone, closing = _Transport(), _Transport()
    writer.write(gone, a.fileno(), b"for the lost connection")
    writer.write(closing, a.fileno(), b"for the closing one")
    writer.forget(gone)
    closing.closing = True
    loop.run_pending()
    assert _received(b) == b"" and gone.queued == [] and closing.queued == []


def test_a_half_closed_connection_gets_its_queued_bytes_through_the_transport(rig):
    a, b, loop, writer = rig
    transport = _Transport()
    writer.write(transport, a.fileno(), b"answer to a client ")
    writer.write(transport, a.fileno(), b"that sent FIN")
    writer.hand_over(transport)  # what the protocols' eof_received do before the transport closes
    assert transport.queued == [b"answer to a client that sent FIN"]
    transport.close()
    loop.run_pending()
    assert _received(b) == b"", "nothing is sent twice"


def test_a_send_error_hands_everything_to_the_transport(rig):
    a, b, loop, writer = rig
    transport = _Transport()
    b.close()  # the peer is gone: send fails (EPIPE), the transport reports it its own way
    writer.write(transport, a.fileno(), b"nobody reads this")
    loop.run_pending()
    assert transport.queued == [b"nobody reads this"]


def test_send_many_reports_each_socket_and_checks_its_arguments(pair):
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = b"z" * (1 << 20)
    first = send_many([a.fileno()], [big])[0]
    assert 0 < first < len(big)
    assert send_many([a.fileno()], [big]) == [0], "a full socket takes nothing (EAGAIN)"
    closed = socket.socket()
    fd = closed.fileno()
    closed.close()
    assert send_many([fd], [b"x"]) == [-1]
    assert send_many([], []) == []
    with pytest.raises(ValueError):
        send_many([a.fileno()], [])
    with pytest.raises(TypeError):
        send_many([a.fileno()], ["text"])
    with pytest.raises(TypeError):
        send_many((a.fileno(),), (b"x",))
    with pytest.raises(TypeError):
        send_many([float(a.fileno())], [b"x"])
    with pytest.raises(TypeError):
        send_many([a.fileno()], [bytearray(b"x")])
    for fd in (-1, 2**32 + a.fileno(), 2**80):
        with pytest.raises(ValueError):
            send_many([fd], [b"x"])

    class _Sneaky:  # an int-like whose conversion would run Python code while the lists are read
        def __index__(self):
            buffers.clear()
            return a.fileno()

    buffers = [b"kept alive"]
    with pytest.raises(TypeError):
        send_many([_Sneaky()], buffers)


def test_without_the_extension_every_write_goes_to_the_transport(pair, monkeypatch):
    a, b = pair
    monkeypatch.setattr(response_writer, "send_many", None)  # as when installed without a C compiler

    class _Info(_Transport):
        def get_extra_info(self, name):
            return a if name == "socket" else None

    transport = _Info()
    fd = response_writer.socket_fd(transport)
    assert fd == -1
    loop = _Loop()
    ResponseWriter(loop).write(transport, fd, b"direct")
    assert transport.queued == [b"direct"] and loop.scheduled == []
