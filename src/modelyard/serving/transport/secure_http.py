"""The REST connection with the security options on: TLS, bearer tokens, size and time limits.

``http_server.serve`` runs this subclass of ``HttpProtocol`` only when a security flag is
set (the caller hands it ``rest_guard(security)``), so a server without them keeps the
unguarded class and pays nothing. This module imports ``http_server``, never the reverse. Tokens are
checked once the headers are in, before any body byte is kept: a refused request is
answered at once and its connection closed.
"""
from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Callable

import httptools
import orjson

from modelyard.errors import HTTP_STATUS
from modelyard.serving.protocol.rest import RestApp
from modelyard.serving.security.auth import Authorizer, authorizer_for
from modelyard.serving.security.limits import ConnectionCount, Limits
from modelyard.serving.transport.http_server import HttpProtocol
from modelyard.serving.transport.response_writer import ResponseWriter


class _Refused(Exception):
    """Raised from a parser callback after answering, to stop the parser."""


@dataclass
class HttpGuard:
    """What every guarded connection of one REST server shares."""

    limits: Limits
    authorizer: Authorizer | None
    count: ConnectionCount


class GuardedHttpProtocol(HttpProtocol):
    def __init__(self, app: RestApp, writer: ResponseWriter, guard: HttpGuard):
        super().__init__(app, writer)
        self.guard = guard
        self.admitted = False
        self.header_bytes = 0
        self.authorization: bytes | None = None
        self.timer: asyncio.TimerHandle | None = None

    # ---- connection -------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if transport.get_extra_info("ssl_object") is not None:
            self.fd = -1  # the writer's raw socket path would bypass TLS: write through the transport
        if not self.guard.count.admit():
            self._fail(503, b"too many connections: try again later")
            return
        self.admitted = True
        self._arm("no request")

    def connection_lost(self, exc) -> None:
        if self.admitted:
            self.admitted = False
            self.guard.count.release()
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, what: str) -> None:
        timeout = self.guard.limits.client_timeout_s
        if timeout and self.timer is None:
            self.timer = self.loop.call_later(timeout, self._too_slow, what)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _too_slow(self, what: str) -> None:
        self.timer = None
        if what == "no request":
            if self.transport is not None:  # nothing sent at all: just close
                self.writer.close(self.transport)
                self.transport = None
            return
        self._fail(408, b"request not received in time (--client_timeout_seconds)")

    def _refuse(self, status: int, message: bytes) -> None:
        self._disarm()
        self._fail(status, message)
        raise _Refused()

    # ---- parser callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.header_bytes = 0
        self.authorization = None
        self._disarm()
        self._arm("request")

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        limit = self.guard.limits.max_request_line_bytes
        if limit and len(self.url) > limit:
            self._refuse(414, b"request URL too long (--max_request_line_bytes)")

    def on_header(self, name: bytes, value: bytes) -> None:
        limit = self.guard.limits.max_header_bytes
        if limit:
            self.header_bytes += len(name) + len(value) + 4
            if self.header_bytes > limit:
                self._refuse(431, b"request headers too large (--max_header_bytes)")
        if len(name) == 13 and name.lower() == b"authorization":
            self.authorization = value
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        authorizer = self.guard.authorizer
        if authorizer is not None:
            method = self.parser.get_method().decode("latin-1")
            path = httptools.parse_url(self.url).path.decode("utf-8", "replace")
            denied = authorizer.check(self.authorization, authorizer.rest_scope(method, path, self.app.metrics_path))
            if denied is not None:
                code, message = denied
                headers = self.app.json_headers
                if HTTP_STATUS[code] == 401:
                    headers = headers + [(b"www-authenticate", b'Bearer realm="modelyard"')]
                # Answered now (the body, if any, is never read) and the connection closed.
                self.early = (HTTP_STATUS[code], headers, orjson.dumps({"error": message}))
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        try:
            super().data_received(data)
        except _Refused:  # pragma: no cover (httptools wraps it; kept for a parser that does not)
            pass


def refuse_plain_on_tls(loop: asyncio.AbstractEventLoop) -> None:
    """Plaintext or garbage on a TLS port fails the handshake: that is the client's error, log it quietly."""
    default = loop.get_exception_handler()

    def handler(the_loop, context) -> None:
        exc = context.get("exception")
        import ssl

        if isinstance(exc, (ssl.SSLError, ConnectionResetError, asyncio.TimeoutError)):
            return
        if default is not None:
            default(the_loop, context)
        else:
            the_loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def rest_guard(security) -> Callable | None:
    """``http_server.serve``'s ``guard`` for ``security`` (``SecurityOptions``): None when it turns
    nothing on, so the plain class runs."""
    if security is None or not security.guards_connections:
        return None
    return functools.partial(guarded_factory, security)


def guarded_factory(security, app: RestApp, writer: ResponseWriter, loop: asyncio.AbstractEventLoop):
    """``(protocol factory, create_server TLS keywords)`` for a REST server with ``security`` on."""
    from modelyard.serving.security.tls import server_context

    guard = HttpGuard(security.limits,
                      authorizer_for(security.auth) if security.auth is not None else None,
                      ConnectionCount(security.limits.max_connections))
    tls = {}
    if security.tls is not None:
        tls = {"ssl": server_context(security.tls, "http/1.1"),
               "ssl_handshake_timeout": security.limits.client_timeout_s or 10.0}
        refuse_plain_on_tls(loop)
    return (lambda: GuardedHttpProtocol(app, writer, guard)), tls
