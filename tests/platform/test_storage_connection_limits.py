"""The platform's connection limits (platform/api/http_limits), one layer down: a tiny HTTP server in
this process behind the same ``Guard`` the API front and the storage use (the storage's own port is
tested end to end in test_storage_guarantees). Each case is a behaviour the issue found missing on the
API port (finding 11): a head that never ends, a body that pauses, silent connections past the cap,
a connection idle after its answer, and the flags that set them."""
from __future__ import annotations

import argparse
import asyncio

import pytest

from modelyard.platform.api import http_limits
from tests.aio import run


class _Answer(asyncio.Protocol):
    """Answers every complete request with 200 (by counting blank lines: enough for these requests)."""

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            self.buf = self.buf[length:]
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


async def _server(limits: http_limits.ConnLimits):
    guard = http_limits.Guard(limits)
    server = await asyncio.get_running_loop().create_server(guard.wrap(_Answer), "127.0.0.1", 0)
    return guard, server, server.sockets[0].getsockname()[1]


async def _closed(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        while await asyncio.wait_for(reader.read(4096), within):
            pass
        return True
    except ConnectionResetError:
        return True
    except asyncio.TimeoutError:
        return False


async def _get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(4096), 5)
    writer.close()
    return answer


def test_a_head_that_never_ends_and_a_paused_body_are_closed_after_the_timeout():
    async def scenario():
        guard, server, port = await _server(http_limits.ConnLimits(client_timeout_s=0.5, max_connections=0))
        head_r, head_w = await asyncio.open_connection("127.0.0.1", port)
        head_w.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
        body_r, body_w = await asyncio.open_connection("127.0.0.1", port)
        body_w.write(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nab")
        trickle_r, trickle_w = await asyncio.open_connection("127.0.0.1", port)
        trickle_w.write(b"GET / HTTP/1.1\r\nX-Slow: ")
        for _ in range(20):  # a header byte every 0.15 s, each well inside the timeout: too slow in total
            if trickle_w.is_closing() or trickle_r.at_eof():
                break
            try:
                trickle_w.write(b"a")
                await trickle_w.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.15)
        assert await _closed(head_r, 3) and await _closed(body_r, 3) and await _closed(trickle_r, 3)
        assert guard.timed_out == 3
        assert (await _get(port)).startswith(b"HTTP/1.1 200")  # and it goes on serving
        server.close()
    run(scenario())


def test_past_the_cap_silent_connections_make_room_and_busy_ones_refuse():
    async def scenario():
        guard, server, port = await _server(http_limits.ConnLimits(client_timeout_s=30, max_connections=5))
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
        assert (await _get(port)).startswith(b"HTTP/1.1 200")  # the oldest silent one made room
        assert await _closed(silent[0][0], 2)
        busy = []
        for _ in range(5):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET / HTTP/1.1\r\n")  # a head under way: never closed to make room
            busy.append((r, w))
        # Wait until the server has read each busy head's first bytes (no guess at how long that takes).
        for _ in range(1000):
            if sum(conn.state == http_limits._HEAD for conn in guard.open) == 5:
                break
            await asyncio.sleep(0.01)
        answer = await _get(port)
        assert answer.startswith(b"HTTP/1.1 503") and b"max_connections" in answer and guard.refused == 1
        for _, w in busy:
            w.close()
        server.close()
    run(scenario())


def test_idle_after_an_answer_closes_only_with_idle_set():
    async def scenario():
        for idle, closes in ((0.3, True), (None, False)):
            _, server, port = await _server(http_limits.ConnLimits(client_timeout_s=0.2, max_connections=0,
                                                                   idle_s=idle))
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(4096), 5)).startswith(b"HTTP/1.1 200")
            assert await _closed(reader, 1.5) is closes
            writer.close()
            server.close()
    run(scenario())


def test_the_flags_and_what_the_platform_passes_on():
    from modelyard.platform.cli import _api_limits

    parser = argparse.ArgumentParser()
    http_limits.add_arguments(parser)
    parser.add_argument("--upstream-timeout-seconds", type=float, default=120.0)
    args = parser.parse_args([])
    assert http_limits.from_args(args) == http_limits.ConnLimits(60.0, 4096, None)
    assert _api_limits(args).idle_s == 60.0  # the front has no keep-alive limit of its own: the timeout is it
    args = parser.parse_args(["--client_timeout_seconds", "0", "--max_connections", "7"])
    assert _api_limits(args) == http_limits.ConnLimits(0.0, 7, None)
    assert http_limits.as_arguments(http_limits.from_args(args)) == [
        "--client_timeout_seconds", "0.0", "--max_connections", "7"]
    with pytest.raises(ValueError):
        http_limits.from_args(parser.parse_args(["--max_connections", "-1"]))


def test_at_the_cap_an_answered_idle_keep_alive_connection_makes_room_but_not_one_being_answered():
    async def scenario():
        guard = http_limits.Guard(http_limits.ConnLimits(client_timeout_s=30, max_connections=2))
        release = asyncio.Event()

        class _Slow(_Answer):  # reports its handling, as the storage's aiohttp handlers do
            def data_received(self, data: bytes) -> None:
                asyncio.get_running_loop().create_task(self._answer(data))

            async def _answer(self, data: bytes) -> None:
                with http_limits.handling(self.transport):
                    if b"slow" in data:
                        await release.wait()
                    self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        server = await asyncio.get_running_loop().create_server(guard.wrap(_Slow), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
        idle_w.write(b"GET / HTTP/1.1\r\n\r\n")
        assert (await asyncio.wait_for(idle_r.read(4096), 5)).startswith(b"HTTP/1.1 200")
        slow_r, slow_w = await asyncio.open_connection("127.0.0.1", port)
        slow_w.write(b"GET /slow HTTP/1.1\r\n\r\n")  # being answered: must stay
        await asyncio.sleep(http_limits.EVICTABLE_IDLE_S + 0.3)
        assert (await _get(port)).startswith(b"HTTP/1.1 200")  # the answered, idle one made room
        assert await _closed(idle_r, 2)
        release.set()
        assert (await asyncio.wait_for(slow_r.read(4096), 5)).startswith(b"HTTP/1.1 200")
        slow_w.close()
        server.close()
    run(scenario())


def test_the_idle_rule_never_closes_a_connection_being_answered():
    async def scenario():
        guard = http_limits.Guard(http_limits.ConnLimits(client_timeout_s=0.2, max_connections=0, idle_s=0.3))

        class _Slow(_Answer):  # a 1.5 s answer, reported as the front and the storage report theirs
            def data_received(self, data: bytes) -> None:
                asyncio.get_running_loop().create_task(self._answer())

            async def _answer(self) -> None:
                with http_limits.handling(self.transport):
                    await asyncio.sleep(1.5)
                    self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        server = await asyncio.get_running_loop().create_server(guard.wrap(_Slow), "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(4096), 5)).startswith(b"HTTP/1.1 200")
        assert await _closed(reader, 2)  # then idle after its answer: closed
        writer.close()
        server.close()
    run(scenario())
