"""The lean gRPC connection with the security options on: TLS (ALPN ``h2``), tokens, limits.

``grpc_h2.LeanGrpcServer`` runs this subclass only when a security flag is set (the caller
hands it ``grpc_guard(security)``; this module imports ``grpc_h2``, never the reverse). A call's
token is checked when its HEADERS arrive, before any of its DATA is kept: a refused call is
answered UNAUTHENTICATED or PERMISSION_DENIED (trailers only) and its stream reset.
With ``--client_timeout_seconds`` the connection preface and each call's whole request
must arrive in time, so a peer trickling bytes cannot hold a stream open.
"""
from __future__ import annotations

import asyncio
import functools
from typing import Callable

from modelyard.errors import Code
from modelyard.serving.security.auth import Authorizer, authorizer_for
from modelyard.serving.security.limits import ConnectionCount
from modelyard.serving.transport import h2_frames as h2
from modelyard.serving.transport.grpc_h2 import _Connection


class GuardedConnection(_Connection):
    def __init__(self, server, authorizer: Authorizer | None, count: ConnectionCount, timeout_s: float):
        super().__init__(server)
        self.authorizer = authorizer
        self.count = count
        self.timeout_s = timeout_s
        self.admitted = False
        self.timers: dict[int, asyncio.TimerHandle] = {}  # stream id -> "request not in yet" timer

    def connection_made(self, transport) -> None:
        if not self.count.admit():
            transport.write(h2.goaway(0, h2.ENHANCE_YOUR_CALM, b"too many connections"))
            transport.close()
            return
        self.admitted = True
        super().connection_made(transport)
        if transport.get_extra_info("ssl_object") is not None:
            self.fd = -1  # the writer's raw socket path would bypass TLS: write through the transport
        if self.timeout_s:
            self.timers[0] = self.loop.call_later(self.timeout_s, self._preface_late)

    def connection_lost(self, exc) -> None:
        if self.admitted:
            self.admitted = False
            self.count.release()
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        if self.transport is not None or self.streams:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.preface_ok and 0 in self.timers:
            self.timers.pop(0).cancel()

    def _preface_late(self) -> None:
        self.timers.pop(0, None)
        if not self.preface_ok:
            self._connection_error(h2.PROTOCOL_ERROR, "no HTTP/2 preface in time (--client_timeout_seconds)")

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        if sid in self.streams or sid <= self.last_sid:
            super()._header_block(sid, flags, block)  # trailers, or a stream closed already
            return
        # Open the stream without ending it, so nothing runs before the check below.
        super()._header_block(sid, flags & ~h2.END_STREAM, block)
        stream = self.streams.get(sid)
        if stream is None:
            return  # refused (too many streams, draining)
        if self.authorizer is not None:
            headers = stream.headers
            denied = self.authorizer.check(headers.authorization, self.authorizer.grpc_scope(headers.path or ""))
            if denied is not None:
                stream.refused = True  # its DATA, if any, is dropped unread
                stream.remote_closed = bool(flags & h2.END_STREAM)
                self._answer(stream, None, *denied)
                return
        if flags & h2.END_STREAM:
            self._end_of_request(stream)
        elif self.timeout_s:
            self.timers[sid] = self.loop.call_later(self.timeout_s, self._request_late, stream)

    def _end_of_request(self, stream) -> None:
        timer = self.timers.pop(stream.sid, None)
        if timer is not None:
            timer.cancel()
        super()._end_of_request(stream)

    def _request_late(self, stream) -> None:
        self.timers.pop(stream.sid, None)
        if not stream.remote_closed and not stream.answered:
            stream.refused = True
            self._answer(stream, None, Code.DEADLINE_EXCEEDED,
                         "request message not received in time (--client_timeout_seconds)")
            self._flush()


def grpc_guard(security) -> Callable | None:
    """``LeanGrpcServer``'s ``guard`` for ``security`` (``SecurityOptions``): None when it turns
    nothing on, so the plain connection class runs."""
    if security is None or not security.guards_connections:
        return None
    return functools.partial(guarded_factory, security)


def guarded_factory(security, server):
    """``(connection factory, create_server TLS keywords)`` for a lean gRPC server with ``security`` on."""
    from modelyard.serving.security.tls import server_context
    from modelyard.serving.transport.secure_http import refuse_plain_on_tls

    authorizer = authorizer_for(security.auth) if security.auth is not None else None
    count = ConnectionCount(security.limits.max_connections)
    timeout = security.limits.client_timeout_s
    tls = {}
    if security.tls is not None:
        tls = {"ssl": server_context(security.tls, "h2"), "ssl_handshake_timeout": timeout or 10.0}
        refuse_plain_on_tls(server.loop)
    return (lambda: GuardedConnection(server, authorizer, count, timeout)), tls
