"""A lean HTTP/1.1 server for the REST API, on httptools' parser and the uvloop event loop.

An ASGI server spent more CPU per request than the whole predict path (scope dicts,
receive/send coroutines, header lists), so requests go straight from the parser to
``RestApp``. Keep-alive, pipelining (answered in order), ``Expect: 100-continue``,
chunked request bodies (decoded by httptools) and the body limit are handled here. Every
byte leaves through the loop's ``ResponseWriter``, which sends a pass's answers together.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import signal
import socket
import weakref
from http import HTTPStatus
from typing import Callable

import httptools

from modelyard.errors import Code, ServingError
from modelyard.serving.transport.loop_bridge import when_done_on_loop
from modelyard.serving.transport.response_writer import ResponseWriter, socket_fd
from modelyard.serving.protocol.rest import RestApp

log = logging.getLogger("modelyard.serving")

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_REASONS[499] = b"Client Closed Request"


def _head(status: int, headers: list, length: int, keep_alive: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Unknown"))]
    lines.extend(name + b": " + value for name, value in headers)
    lines.append(b"content-length: %d" % length)
    if not keep_alive:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _json_head(app: RestApp, status: int, length: int, keep_alive: bool) -> bytes:
    """``_head`` for ``app.json_headers``, from a per-status cache: most responses take this path."""
    cached = app.json_heads.get(status)
    if cached is None:
        full = _head(status, app.json_headers, 0, True)
        cached = app.json_heads[status] = full[: full.index(b"content-length: ") + len(b"content-length: ")]
    if keep_alive:
        return cached + b"%d\r\n\r\n" % length
    return cached + b"%d\r\nconnection: close\r\n\r\n" % length


class _Request:
    __slots__ = ("method", "path", "body", "keep_alive", "response", "answered", "timer", "pending", "header_length")

    def __init__(self, method: str, path: str, body: bytes, keep_alive: bool, response=None,
                 header_length: bytes | None = None):
        self.method, self.path, self.body, self.keep_alive = method, path, body, keep_alive
        self.header_length = header_length  # V2's Inference-Header-Content-Length (binary tensor data)
        self.response = response  # set when answered before the body (413, immediate routes)
        self.answered = False  # offloaded: by its result or by its timeout, whichever comes first
        self.timer = None
        self.pending = None  # a predict waiting in a batching queue (core.QueuedPredict)


# Pipelined requests queue while one runs; past this many, stop reading until the queue drains.
_PAUSE_AT = 8
# On SIGTERM: a connection idle this long is closed; the whole drain waits at most _DRAIN_MAX_S.
_DRAIN_IDLE_S = 0.5
_DRAIN_MAX_S = 25.0


class HttpProtocol(asyncio.Protocol):
    def __init__(self, app: RestApp, writer: ResponseWriter | None = None):
        self.app = app
        self.loop = asyncio.get_running_loop()
        self.writer = writer or ResponseWriter(self.loop)  # serve() shares one among the loop's connections
        self.parser = httptools.HttpRequestParser(self)
        self.transport = None
        self.fd = -1
        self.queue: collections.deque[_Request] = collections.deque()
        self.busy = False
        self.paused = False
        self.owed_continue = False
        self.waiting: _Request | None = None  # the predict this connection has in a batching queue
        self.draining = False  # SIGTERM: the next request answered is this connection's last
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.chunks: list[bytes] = []
        self.size = 0
        self.expect_continue = False
        self.early = None
        self.header_length = None

    # ---- transport events ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.fd = socket_fd(transport)

    def connection_lost(self, exc) -> None:
        if self.transport is not None:
            self.writer.forget(self.transport)
        self.transport = None
        request, self.waiting = self.waiting, None
        if request is not None and not request.answered:
            # Nobody will read its answer: its rows leave the queue now, counted CANCELLED.
            if request.timer is not None:
                request.timer.cancel()
            request.pending.expire(ServingError(Code.CANCELLED, "The client closed the connection"))

    def eof_received(self) -> None:
        # The client half-closed: the transport closes now (returning None), after sending what it holds.
        if self.transport is not None:
            self.writer.hand_over(self.transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, b"protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}".encode())

    def _fail(self, status: int, message: bytes) -> None:
        if self.transport is not None:
            body = b'{"error": "' + message.replace(b'"', b"'") + b'"}'
            self._send(_head(status, self.app.json_headers, len(body), False) + body)
            self._close()

    # ---- parser callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" and self.app.max_body_bytes and value.isdigit():
            if int(value) > self.app.max_body_bytes:
                self.early = self.app.body_too_large()
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        elif name == b"inference-header-content-length":
            self.header_length = value

    def on_headers_complete(self) -> None:
        method = self.parser.get_method().decode("latin-1")
        path = httptools.parse_url(self.url).path.decode("utf-8", "replace")
        self.method, self.path = method, path
        if self.early is not None and self.transport is not None and not self.queue and not self.busy:
            # Declared too large: answer now and close rather than read a body we refuse.
            status, headers, payload = self.early
            self._send(_head(status, headers, len(payload), False) + payload)
            self._close()
            return
        if self.early is None:
            self.early = self.app.immediate(method, path)
        if self.expect_continue and self.early is None and self.transport is not None:
            if self.busy or self.queue:
                # Earlier responses go first: owe the 100 and stop reading until they are written.
                self.owed_continue = True
                if not self.paused:
                    self.transport.pause_reading()
                    self.paused = True
            else:
                self._send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self.early is not None:
            return  # answered already: drop the rest of the body
        self.size += len(body)
        if self.app.max_body_bytes and self.size > self.app.max_body_bytes:
            self.early = self.app.body_too_large()
            self.chunks = []
            return
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        keep_alive = self.parser.should_keep_alive() and not self.draining
        self.queue.append(_Request(self.method, self.path, b"".join(self.chunks), keep_alive, self.early,
                                   self.header_length))
        self._reset()
        if not self.busy:
            self._next()
        elif len(self.queue) >= _PAUSE_AT and not self.paused and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True

    # ---- answering, in order ----------------------------------------------------------------
    def _next(self) -> None:
        while self.queue and not self.busy and self.transport is not None:
            request = self.queue.popleft()
            if request.response is not None:
                self._write(request, request.response)
            elif self.app.v2.owns(request.path):
                self._v2(request)
            elif self.app.cheap(request.path):
                # A LiteRT call costs microseconds: a thread hop would cost more than the model.
                status, payload = self.app.handle(request.method, request.path, request.body)
                self._send(_json_head(self.app, status, len(payload), request.keep_alive) + payload)
                if not request.keep_alive:
                    self._close()
            else:
                started = self.app.submit(request.method, request.path, request.body)
                if started is None:
                    self.busy = True
                    self._offload(request)
                elif type(started) is tuple:  # refused before the queue
                    self._write(request, (started[0], self.app.json_headers, started[1]))
                else:
                    self.busy = True
                    self._await_batch(request, started)
        if self.transport is None:
            return
        if self.owed_continue and not self.busy and not self.queue:
            self.owed_continue = False
            self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self.paused and len(self.queue) < _PAUSE_AT and not self.owed_continue:
            self.transport.resume_reading()
            self.paused = False

    # No coroutine, task or wait_for per request: a pool future, a done-callback back into the
    # loop and, with --rest_api_timeout_in_ms, one timer. Reading stays on (it is paused only
    # for a long pipeline), sparing two epoll updates per request.
    def _offload(self, request: _Request) -> None:
        app, loop = self.app, self.loop
        future = app.pool.submit(app.handle, request.method, request.path, request.body)
        if app.timeout_s:
            request.timer = loop.call_later(app.timeout_s, self._timed_out, request)
        when_done_on_loop(loop, future, self._answer, request)

    # The Open Inference Protocol (protocol/v2_rest.py): its answers carry their own headers.
    def _v2(self, request: _Request) -> None:
        app, v2 = self.app, self.app.v2
        if v2.cheap(request.path):
            self._write(request, v2.handle(request.method, request.path, request.body, request.header_length))
            return
        started = v2.submit(request.method, request.path, request.body, request.header_length)
        if type(started) is tuple:  # refused before the queue
            self._write(request, started)
            return
        self.busy = True
        if started is not None:  # a batching model: waits in its queue holding no thread, as predicts do
            self._await_batch(request, started, functools.partial(v2.finish_queued, started))
            return
        future = app.pool.submit(v2.handle, request.method, request.path, request.body, request.header_length)
        if app.timeout_s:
            request.timer = self.loop.call_later(app.timeout_s, self._timed_out, request)
        when_done_on_loop(self.loop, future, self._answer, request)

    # A predict on a batching model: parsed and checked here, then it waits in the queue holding
    # no thread; the batch thread hands the answer back into the loop (a batch at once) to encode and write.
    # ``finish`` answers it: TF Serving's (status, payload) by default, V2's (status, headers, payload).
    def _await_batch(self, request: _Request, pending, finish=None) -> None:
        loop = self.loop
        request.pending = pending
        self.waiting = request
        if self.app.timeout_s:
            request.timer = loop.call_later(self.app.timeout_s, self._timed_out, request)
        # Even when the loop has closed, finishing releases the version.
        if finish is None:
            finish = functools.partial(self.app.finish_queued, pending, request.method, request.path)
        pending.future.call_on_loop(loop, self._answer_batch, request, finish, if_closed=finish)

    def _answer_batch(self, request: _Request, finish, _future) -> None:
        result = finish()  # always: it releases the version and counts the request
        if request.answered:  # timed out already
            return
        if request.timer is not None:
            request.timer.cancel()
        self._finish(request, result if len(result) == 3 else (result[0], self.app.json_headers, result[1]))

    def _answer(self, request: _Request, future) -> None:
        if request.answered:  # timed out already
            return
        if request.timer is not None:
            request.timer.cancel()
        try:
            result = future.result()  # (status, payload), or V2's (status, headers, payload)
            response = result if len(result) == 3 else (result[0], self.app.json_headers, result[1])
        except BaseException as exc:  # handle() answers every error itself; this is a last resort
            log.error("REST request failed: %s %s: %r", request.method, request.path, exc)
            response = (500, self.app.json_headers, b'{"error": "Internal error"}')
        self._finish(request, response)

    def _timed_out(self, request: _Request) -> None:
        if not request.answered:
            self._finish(request, self.app.deadline_exceeded())
            if request.pending is not None:
                request.pending.expire()  # its queued rows leave the queue; counted as DEADLINE_EXCEEDED

    def _finish(self, request: _Request, response) -> None:
        request.answered = True
        self.busy = False
        self.waiting = None
        if self.transport is not None:
            self._write(request, response)
            if self.transport is not None:
                self._next()

    def _write(self, request: _Request, response) -> None:
        status, headers, payload = response
        if headers is self.app.json_headers:
            head = _json_head(self.app, status, len(payload), request.keep_alive)
        else:
            head = _head(status, headers, len(payload), request.keep_alive)
        self._send(head + payload)
        if not request.keep_alive:
            self._close()

    # ---- stopping: what is in flight is answered, no request is cut off --------------------------
    def drain(self) -> None:
        """The server stops (SIGTERM): requests in flight are answered; a request that arrives is answered
        with ``connection: close``; a connection idle for ``_DRAIN_IDLE_S`` closes (a client sending on it
        meanwhile still gets its answer, so clients see a close between requests, never a cut request)."""
        self.draining = True
        if self.queue:  # pipelined and not started yet: the last one closes the connection
            self.queue[-1].keep_alive = False
        self.loop.call_later(_DRAIN_IDLE_S, self._close_when_idle)

    def _close_when_idle(self) -> None:
        if self.transport is None:
            return
        if self.busy or self.queue or self.url or self.chunks:  # answering, or a request is arriving
            self.loop.call_later(_DRAIN_IDLE_S, self._close_when_idle)
            return
        self._close()

    # Every byte goes through the loop's writer: it keeps each connection's bytes in order.
    def _send(self, data: bytes) -> None:
        self.writer.write(self.transport, self.fd, data)

    def _close(self) -> None:
        self.writer.close(self.transport)
        self.transport = None


# ``guard(app, writer, loop)`` -> (protocol factory, ``create_server`` TLS keywords).
Guard = Callable[[RestApp, ResponseWriter, asyncio.AbstractEventLoop], tuple[Callable[[], asyncio.Protocol], dict]]


def serve(app: RestApp, sock: socket.socket, guard: Guard | None = None) -> None:
    """Serve ``app`` on the listening ``sock`` until SIGINT or SIGTERM.

    ``guard`` (``secure_http.rest_guard``) makes the guarded connections when TLS, tokens or
    limits are on. The caller passes it in: TLS wraps this plain transport from one side, so
    this module never imports ``secure_http`` (which subclasses ``HttpProtocol``).
    """
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover (uvloop is a dependency; this keeps odd platforms working)
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stopped = asyncio.Event()
    writer = ResponseWriter(loop)

    async def main() -> None:
        factory, tls = (lambda: HttpProtocol(app, writer)), {}
        if guard is not None:
            factory, tls = guard(app, writer, loop)
        connections: weakref.WeakSet[HttpProtocol] = weakref.WeakSet()

        def tracked() -> HttpProtocol:
            protocol = factory()
            connections.add(protocol)
            return protocol

        server = await loop.create_server(tracked, sock=sock, backlog=2048, **tls)
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stopped.set)
            except (ValueError, RuntimeError):  # not the main thread
                pass
        async with server:
            await stopped.wait()
            # Drain: no new connection (refused at once), the open ones answer what they hold, then close.
            server.close()
            for protocol in list(connections):
                protocol.drain()
            deadline = loop.time() + _DRAIN_MAX_S
            while any(p.transport is not None for p in list(connections)) and loop.time() < deadline:
                await asyncio.sleep(0.02)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
