"""Pooled keep-alive HTTP/1.1 connections from the platform to one upstream (a replica, or the
platform's own API app), parsed with httptools: the gateway's hot path, without a client library's
per-request overhead.

``Upstream.request`` sends one request and returns (status, headers, body). A connection that
fails raises ``ConnectionError`` (``UpstreamTimeout`` past the request's ``timeout``; the caller decides
whether to retry elsewhere); a connection is
reused only after a complete response that allows keep-alive. An upstream that wants a bearer token
(a replica: ``replica_secrets``) gets it on every request (``authorization``).
"""
from __future__ import annotations

import asyncio

import httptools


class UpstreamTimeout(ConnectionError):
    """The upstream did not answer within the request's deadline (its connection is closed)."""


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.body: list[bytes] = []
        self.headers: list[tuple[bytes, bytes]] = []
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"bad HTTP response: {exc}"))

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._fail(ConnectionError(f"upstream closed the connection{f': {exc}' if exc else ''}"))

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            keep = self.parser.should_keep_alive()
            self.waiter.set_result((self.parser.get_status_code(), self.headers, b"".join(self.body), keep))


class Upstream:
    """Connections to ``host:port``; idle ones are reused, most recent first."""

    def __init__(self, host: str, port: int, authorization: bytes | None = None, max_idle: int = 256) -> None:
        self.host, self.port = host, port
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        self._host_header = f"{host}:{port}".encode()
        # Sent with every request, after the caller's headers (never one of theirs: the gateway's own).
        self._auth_line = b"Authorization: " + authorization + b"\r\n" if authorization else b""

    async def request(self, method: bytes, target: bytes, body: bytes = b"",
                      headers: list[tuple[bytes, bytes]] = (), timeout: float = 120.0):
        """(status, [(name, value)], body) of one request."""
        conn = None
        while self._idle:
            c = self._idle.pop()
            if not c.closed:
                conn = c
                break
        if conn is None:
            loop = asyncio.get_running_loop()
            try:
                _, conn = await loop.create_connection(_Conn, self.host, self.port)
            except OSError as exc:
                raise ConnectionError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        head = [method, b" ", target, b" HTTP/1.1\r\nHost: ", self._host_header,
                b"\r\nContent-Length: ", str(len(body)).encode(), b"\r\n"]
        for name, value in headers:
            head += [name, b": ", value, b"\r\n"]
        head += [self._auth_line, b"\r\n"]
        conn.waiter = asyncio.get_running_loop().create_future()
        conn.body, conn.headers = [], []
        conn.transport.write(b"".join(head) + body)
        try:
            status, rheaders, rbody, keep = await asyncio.wait_for(conn.waiter, timeout)
        except asyncio.TimeoutError:
            conn._fail(ConnectionError("timed out"))
            raise UpstreamTimeout(f"{self.host}:{self.port} did not answer within {timeout:g} s") from None
        conn.waiter = None
        if keep and not conn.closed and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.transport.close()
        return status, rheaders, rbody

    def close(self) -> None:
        for c in self._idle:
            if c.transport is not None:
                c.transport.close()
        self._idle.clear()
