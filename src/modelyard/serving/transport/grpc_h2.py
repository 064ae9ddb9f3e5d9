"""A lean gRPC server: unary calls over cleartext HTTP/2 (h2c, prior knowledge) on uvloop.

grpcio's Python server spent ~250-400 µs of CPU per call on an empty handler (its
C-core completion queues, thread hand-offs and per-call Python objects), several
times what the model costs. This server parses frames straight off the socket and
answers with precomputed header blocks; models the manager runs inline (LiteRT,
microseconds) are called on the event loop, others on a thread pool.

HTTP/2 subset: preface, SETTINGS (+ACK; the peer's INITIAL_WINDOW_SIZE and
MAX_FRAME_SIZE are honoured), PING ack, flow control both ways, HEADERS +
CONTINUATION with PADDED/PRIORITY, RST_STREAM, GOAWAY, any number of streams per
connection. gRPC: length-prefixed messages, ``grpc-timeout``, identity encoding
only, trailers-only error responses. The services and their error mapping are
``grpc_api.Services``, shared with the grpcio server.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from google.protobuf.message import DecodeError

from modelyard.errors import Code, ServingError
from modelyard.ports import bind_failure
from modelyard.serving.transport import h2_frames as h2
from modelyard.serving.batching.scheduler import bind_request_timeout, set_request_timeout
from modelyard.serving.core import ServingCore
from modelyard.serving.protocol.grpc_api import Method, Services
from modelyard.serving.security.limits import RESET_BUDGET, H2FloodBudget
from modelyard.serving.transport.loop_bridge import when_done_on_loop
from modelyard.serving.transport.response_writer import ResponseWriter, socket_fd

log = logging.getLogger("modelyard.serving")

# Receive windows we advertise. Large, so a client sends a batch of images without
# waiting for our WINDOW_UPDATEs; replenished once half is used.
_STREAM_WINDOW = 4 * 1024 * 1024
_CONN_WINDOW = 16 * 1024 * 1024
_MAX_STREAMS = 1000
_MAX_HEADER_BLOCK = 256 * 1024  # a header block split over CONTINUATIONs beyond this is an attack
# A reset this close to the call's deadline is the client's deadline passing (its clock started
# one network trip before ours), not a cancel.
_DEADLINE_SKEW_S = 0.25

_SERVER_SETTINGS = h2.settings({
    h2.SETTINGS_ENABLE_PUSH: 0,
    h2.SETTINGS_MAX_CONCURRENT_STREAMS: _MAX_STREAMS,
    h2.SETTINGS_INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
}) + h2.window_update(0, _CONN_WINDOW - h2.DEFAULT_WINDOW)

_PING_ACK_HEADER = h2.frame_header(h2.PING, h2.ACK, 0, 8)


class _Stream:
    __slots__ = ("sid", "headers", "chunks", "size", "remote_closed", "answered", "send_window",
                 "pending", "trailer", "timer", "consumed", "deadline", "refused", "queued")

    def __init__(self, sid: int, send_window: int):
        self.sid = sid
        self.headers: h2.RequestHeaders | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.remote_closed = False  # END_STREAM received
        self.answered = False  # a response (or an error) has been queued
        self.send_window = send_window
        self.pending: memoryview | None = None  # response DATA waiting for flow-control window
        self.trailer: bytes = b""  # trailers HEADERS frame to send after ``pending``
        self.timer = None
        self.consumed = 0  # DATA bytes received since our last stream WINDOW_UPDATE
        self.deadline: float | None = None
        self.refused = False  # answered early (too large): drop the rest of its DATA
        self.queued = None  # its Predict waiting in a batching queue (core.QueuedPredict)


def _abandon(stream: _Stream) -> None:
    """The client is gone (RST_STREAM, or the connection closed): stop the stream's timer.

    A Predict still in a batching queue leaves it now rather than wait for a batch nobody
    will read. It is counted DEADLINE_EXCEEDED when its deadline is (nearly) up: a client
    resets a unary call when its deadline passes, a little before the server's own timer,
    which started when the request arrived. Otherwise the client cancelled: CANCELLED.
    """
    if stream.timer is not None:
        stream.timer.cancel()
        stream.timer = None
    if stream.queued is not None:
        near_deadline = stream.deadline is not None and stream.deadline - time.monotonic() <= _DEADLINE_SKEW_S
        stream.queued.expire(None if near_deadline else ServingError(Code.CANCELLED, "The client cancelled the call"))


class _Connection(asyncio.Protocol):
    def __init__(self, server: "LeanGrpcServer"):
        self.server = server
        self.services = server.services
        self.loop = server.loop
        self.transport = None
        self.fd = -1
        self.buf = bytearray()
        self.preface_ok = False
        self.streams: dict[int, _Stream] = {}
        self.last_sid = 0
        self.peer_window = h2.DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.peer_max_frame = h2.DEFAULT_MAX_FRAME
        self.send_window = h2.DEFAULT_WINDOW  # connection-level window for our DATA
        self.conn_consumed = 0
        self.blocked: collections.deque[_Stream] = collections.deque()  # streams waiting for window
        self.decoder = h2.HeaderDecoder()
        self.continuation: tuple[int, int, list[bytes]] | None = None  # (sid, flags, fragments)
        self.out: list[bytes] = []
        self.flush_queued = False  # a _queued_flush is waiting in the loop's ready queue
        self.draining = False  # GOAWAY sent: finish the streams in flight, accept no more
        self.budget = H2FloodBudget()  # control frames that carry no call (floods, rapid reset)
        self.resets = H2FloodBudget(*RESET_BUDGET)  # calls the client cancelled: rapid reset

    # ---- transport events ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.fd = socket_fd(transport)
        self.server.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.out.append(_SERVER_SETTINGS)  # the server preface may go before the client's
        self._flush()

    def connection_lost(self, exc) -> None:
        if self.transport is not None:
            self.server.writer.forget(self.transport)
        self.transport = None
        self.server.connections.discard(self)
        for stream in self.streams.values():
            _abandon(stream)
        self.streams.clear()
        self.blocked.clear()

    def eof_received(self) -> None:
        # The client half-closed: the transport closes now (returning None), after sending what it holds.
        if self.transport is not None:
            self.server.writer.hand_over(self.transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        buf = self.buf
        buf += data
        try:
            if not self.preface_ok:
                if len(buf) < len(h2.PREFACE):
                    if not h2.PREFACE.startswith(bytes(buf)):
                        raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if buf[: len(h2.PREFACE)] != h2.PREFACE:
                    raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                del buf[: len(h2.PREFACE)]
                self.preface_ok = True
            pos, end = 0, len(buf)
            unpack = h2.FRAME_HEADER.unpack_from
            while end - pos >= 9:
                hi, lo, kind, flags, sid = unpack(buf, pos)
                length = hi << 8 | lo
                if length > _MAX_FRAME_RECEIVED:
                    raise h2.ConnectionError_(h2.FRAME_SIZE_ERROR, f"frame of {length} bytes")
                if end - pos - 9 < length:
                    break
                payload = bytes(buf[pos + 9: pos + 9 + length])
                pos += 9 + length
                self._frame(kind, flags, sid & 0x7FFFFFFF, payload)
                if self.transport is None:
                    return
            if pos:
                del buf[:pos]
        except h2.ConnectionError_ as exc:
            self._connection_error(exc.code, str(exc))
            return
        self._flush()

    def _connection_error(self, code: int, message: str) -> None:
        log.debug("gRPC connection error %d: %s", code, message)
        if self.transport is not None:
            self.out.append(h2.goaway(self.last_sid, code, message.encode("utf-8", "replace")[:256]))
            self._close()

    def _flush(self) -> None:
        # Through the loop's writer: the frames of every connection answered in this pass go out
        # together at its end, GIL released (response_writer).
        if self.out and self.transport is not None:
            self.server.writer.write(self.transport, self.fd, b"".join(self.out) if len(self.out) > 1 else self.out[0])
        self.out.clear()

    def _close(self) -> None:
        """Send what is queued, then close; connection_lost still follows."""
        self._flush()
        self.server.writer.close(self.transport)
        self.transport = None

    # ---- frames -------------------------------------------------------------------------------
    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self.continuation is not None and kind != h2.CONTINUATION:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == h2.DATA:
            self._data(flags, sid, payload)
        elif kind == h2.HEADERS:
            self._headers(flags, sid, payload)
        elif kind == h2.CONTINUATION:
            self._continuation(flags, sid, payload)
        elif kind == h2.SETTINGS:
            self._spend("SETTINGS")
            self._settings(flags, sid, payload)
        elif kind == h2.PING:
            self._spend("PING")
            if sid != 0 or len(payload) != 8:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR if sid else h2.FRAME_SIZE_ERROR, "bad PING")
            if not flags & h2.ACK:
                self.out.append(_PING_ACK_HEADER + payload)
        elif kind == h2.WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif kind == h2.RST_STREAM:
            if sid == 0 or len(payload) != 4:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "bad RST_STREAM")
            self._spend("RST_STREAM")
            # Rapid reset: each cancelled call cost a HEADERS decode and a stream, so cancellations
            # get a budget of their own, far below the one for cheap control frames.
            if not self.resets.spend():
                raise h2.ConnectionError_(h2.ENHANCE_YOUR_CALM, "too many cancelled streams (rapid reset)")
            stream = self.streams.pop(sid, None)
            if stream is not None:
                stream.answered = True  # the client gave up: drop whatever the handler returns
                _abandon(stream)
                stream.pending = None
        elif kind == h2.GOAWAY:
            pass  # the client closes the connection once its calls finish
        elif kind == h2.PRIORITY:
            self._spend("PRIORITY")
            if sid == 0:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "PRIORITY on stream 0")
        elif kind == h2.PUSH_PROMISE:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "clients must not push")
        else:
            self._spend("unknown frame")  # ignored (RFC 7540 §4.1), but not for free

    def _spend(self, what: str) -> None:
        if not self.budget.spend():
            raise h2.ConnectionError_(h2.ENHANCE_YOUR_CALM, f"too many {what} frames")

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & h2.ACK:
            return
        if len(payload) % 6:
            raise h2.ConnectionError_(h2.FRAME_SIZE_ERROR, "SETTINGS length")
        for i in range(0, len(payload), 6):
            ident = payload[i] << 8 | payload[i + 1]
            value = int.from_bytes(payload[i + 2: i + 6], "big")
            if ident == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > h2.MAX_WINDOW:
                    raise h2.ConnectionError_(h2.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                delta = value - self.peer_window
                self.peer_window = value
                for stream in self.streams.values():  # §6.9.2: applies to open streams too
                    stream.send_window += delta
            elif ident == h2.SETTINGS_MAX_FRAME_SIZE:
                if not h2.DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "bad MAX_FRAME_SIZE")
                self.peer_max_frame = value
            # HEADER_TABLE_SIZE needs nothing: responses never use the dynamic table.
        self.out.append(h2.SETTINGS_ACK)
        if self.blocked:
            self._pump()

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise h2.ConnectionError_(h2.FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > h2.MAX_WINDOW:
                raise h2.ConnectionError_(h2.FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            stream = self.streams.get(sid)
            if stream is None:
                return  # a stream we finished: updates may still be in flight
            if increment == 0:
                self._reset(stream, h2.PROTOCOL_ERROR)
                return
            stream.send_window += increment
            if stream.send_window > h2.MAX_WINDOW:
                self._reset(stream, h2.FLOW_CONTROL_ERROR)
                return
        if self.blocked:
            self._pump()

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "HEADERS on stream 0")
        start, end = 0, len(payload)
        if flags & h2.PADDED:
            if not payload:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "PADDED without a pad length")
            start, end = 1, end - payload[0]
        if flags & h2.PRIORITY_FLAG:
            start += 5
        if end < start:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "padding exceeds the frame")
        block = payload[start:end] if (start or end != len(payload)) else payload
        if flags & h2.END_HEADERS:
            self._header_block(sid, flags, block)
        else:
            self.continuation = (sid, flags, [block])

    def _continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if self.continuation is None or self.continuation[0] != sid:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "unexpected CONTINUATION")
        fragments = self.continuation[2]
        fragments.append(payload)
        self._spend("CONTINUATION")  # empty CONTINUATIONs would grow the list for ever
        if sum(map(len, fragments)) > _MAX_HEADER_BLOCK:
            raise h2.ConnectionError_(h2.ENHANCE_YOUR_CALM, "header block too large")
        if flags & h2.END_HEADERS:
            first_flags = self.continuation[1]
            self.continuation = None
            self._header_block(sid, first_flags, b"".join(fragments))

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        headers = self.decoder.decode(block)  # always: the HPACK table must follow the peer's
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: they can only end the stream
            if not flags & h2.END_STREAM:
                self._reset(stream, h2.PROTOCOL_ERROR)
                return
            self._end_of_request(stream)
            return
        if sid <= self.last_sid:
            return  # a stream we already closed (e.g. reset after an early answer)
        if not sid & 1:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "even stream id from a client")
        self.last_sid = sid
        if self.draining or len(self.streams) >= _MAX_STREAMS:
            self._spend("refused HEADERS")
            self.out.append(h2.rst_stream(sid, h2.REFUSED_STREAM))
            return
        stream = _Stream(sid, self.peer_window)
        stream.headers = headers
        if headers.timeout is not None:
            stream.deadline = time.monotonic() + headers.timeout
        self.streams[sid] = stream
        if flags & h2.END_STREAM:
            self._end_of_request(stream)

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "DATA on stream 0")
        length = len(payload)  # flow control counts padding too
        if length:
            self.conn_consumed += length
            if self.conn_consumed >= _CONN_WINDOW // 2:
                self.out.append(h2.window_update(0, self.conn_consumed))
                self.conn_consumed = 0
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid > self.last_sid:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # closed by us already (early answer, reset): drop
        if not length and not flags & h2.END_STREAM:
            self._spend("empty DATA")
        if flags & h2.PADDED:
            if not payload or payload[0] >= length:
                raise h2.ConnectionError_(h2.PROTOCOL_ERROR, "bad DATA padding")
            payload = payload[1: length - payload[0]]
        if not stream.refused and payload:
            stream.chunks.append(payload)
            stream.size += len(payload)
            limit = self.server.max_receive_bytes
            if stream.size > limit + 5 or (stream.size >= 5 and self._declared_size(stream) > limit):
                stream.refused = True
                stream.chunks = []
                size = max(stream.size - 5, self._declared_size(stream) if stream.size >= 5 else 0)
                self._answer(stream, None, Code.RESOURCE_EXHAUSTED,
                             f"Received message larger than max ({size} vs. {limit})")
        if flags & h2.END_STREAM:
            self._end_of_request(stream)
        elif length and not stream.refused:  # a refused stream is reset: it needs no more window
            stream.consumed += length
            if stream.consumed >= _STREAM_WINDOW // 2:
                self.out.append(h2.window_update(sid, stream.consumed))
                stream.consumed = 0

    @staticmethod
    def _declared_size(stream: _Stream) -> int:
        first = stream.chunks[0] if stream.chunks and len(stream.chunks[0]) >= 5 else b"".join(stream.chunks)
        return int.from_bytes(first[1:5], "big") if len(first) >= 5 else 0

    # ---- calls --------------------------------------------------------------------------------
    def _end_of_request(self, stream: _Stream) -> None:
        stream.remote_closed = True
        if stream.answered:
            self._maybe_close(stream)
            return
        headers = stream.headers
        method = self.services.methods.get(headers.path)
        if method is None:
            self._answer(stream, None, Code.UNIMPLEMENTED, "Method not found!")
            return
        if headers.encoding not in (None, "identity"):
            self._answer(stream, None, Code.UNIMPLEMENTED,
                         f"grpc-encoding {headers.encoding} is not supported; send identity")
            return
        body = stream.chunks[0] if len(stream.chunks) == 1 else b"".join(stream.chunks)
        stream.chunks = []
        if len(body) < 5:
            self._answer(stream, None, Code.INTERNAL, "Expected one request message, got none")
            return
        if body[0]:
            self._answer(stream, None, Code.INTERNAL, "Compressed message without a grpc-encoding")
            return
        if len(body) != 5 + int.from_bytes(body[1:5], "big"):
            self._answer(stream, None, Code.INTERNAL, "Expected exactly one complete request message")
            return
        try:
            request = method.request_class.FromString(memoryview(body)[5:])
        except DecodeError:
            self._answer(stream, None, Code.INTERNAL, "Exception deserializing request!")
            return
        remaining = None
        if stream.deadline is not None:
            remaining = stream.deadline - time.monotonic()
            if remaining <= 0:
                self._answer(stream, None, Code.DEADLINE_EXCEEDED, "Deadline Exceeded")
                return
        spec = getattr(request, "model_spec", None)
        model = spec.name if spec is not None else getattr(request, "model_name", None)  # V2's ModelInfer
        if model is not None and self.server.runs_inline(model):
            # Microseconds of model: a thread hop would cost more than the call.
            set_request_timeout(remaining)
            response, code, message = method.call(request)
            self._answer(stream, None if response is None else method.response_serializer(response), code, message)
            return
        # A Predict or V2 ModelInfer on a batching model waits in its queue holding no thread.
        start = self.services.start_predict if spec is not None and method.name == "Predict" else \
            self.services.start_infer if method.name == "ModelInfer" else None
        if start is not None:
            started = start(request, stream.deadline, self.server.pool)
            if type(started) is tuple:  # refused before the queue
                self._answer(stream, *started)
                return
            if started is not None:
                self._await_batch(stream, started)
                return
        self._offload(stream, method, request, remaining)

    # A Predict on a batching model waits in the queue holding no thread; the batch thread's
    # hand-back (a batch at once) runs on the loop to serialize and answer.
    def _await_batch(self, stream: _Stream, pending) -> None:
        loop = self.loop
        stream.queued = pending
        if stream.deadline is not None:
            stream.timer = loop.call_later(stream.deadline - time.monotonic(), self._batch_timed_out, stream)
        # Even when the loop has closed, finishing releases the version.
        finish = functools.partial(self.services.finish_queued, pending)
        pending.future.call_on_loop(loop, self._batch_done, stream, finish, if_closed=finish)

    def _batch_done(self, stream: _Stream, finish, _future) -> None:
        payload, code, message = finish()  # always: it releases the version and counts the request
        self._answer(stream, payload, code, message)
        # A batch answers many streams at once, often several on this connection: their
        # hand-backs sit in the loop's ready queue together, so one write after them sends all.
        if not self.flush_queued:
            self.flush_queued = True
            self.loop.call_soon(self._queued_flush)

    def _queued_flush(self) -> None:
        self.flush_queued = False
        self._flush()

    def _batch_timed_out(self, stream: _Stream) -> None:
        self._timed_out(stream)
        stream.queued.expire()  # its queued rows leave the queue; counted as DEADLINE_EXCEEDED

    def _offload(self, stream: _Stream, method: Method, request, remaining: float | None) -> None:
        loop = self.loop
        future = self.server.pool.submit(bind_request_timeout(_call_and_serialize, remaining), method, request)
        if remaining is not None:
            stream.timer = loop.call_later(remaining, self._timed_out, stream)
        when_done_on_loop(loop, future, self._done, stream)

    def _done(self, stream: _Stream, future) -> None:
        try:
            payload, code, message = future.result()
        except BaseException as exc:  # Services answer every error themselves; this is a last resort
            log.error("gRPC call failed: %r", exc)
            payload, code, message = None, Code.INTERNAL, f"{type(exc).__name__}: {exc}"
        self._answer(stream, payload, code, message)
        self._flush()

    def _timed_out(self, stream: _Stream) -> None:
        stream.timer = None
        self._answer(stream, None, Code.DEADLINE_EXCEEDED, "Deadline Exceeded")
        self._flush()

    # ---- responses ----------------------------------------------------------------------------
    def _answer(self, stream: _Stream, payload: bytes | None, code: Code, message: str) -> None:
        if stream.answered or self.transport is None:
            return
        stream.answered = True
        if stream.timer is not None:
            stream.timer.cancel()
            stream.timer = None
        sid = stream.sid
        trailer_block = h2.OK_TRAILERS if code == Code.OK else h2.trailers(code, message)
        if payload is None:  # trailers-only: one HEADERS frame ends the stream
            block = h2.RESPONSE_HEADERS + trailer_block
            self.out.append(h2.frame_header(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, len(block)) + block)
            stream.pending = None
            self._maybe_close(stream)
            return
        size = len(payload) + 5
        trailer = h2.frame_header(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, len(trailer_block)) + trailer_block
        head = _response_headers(sid)
        if size <= self.peer_max_frame and size <= self.send_window and size <= stream.send_window and not self.blocked:
            # The usual case: the whole response in three frames, one write.
            self.send_window -= size
            stream.send_window -= size
            self.out.append(b"".join((head, h2.frame_header(h2.DATA, 0, sid, size), b"\x00",
                                      (size - 5).to_bytes(4, "big"), payload, trailer)))
            self._maybe_close(stream)
            return
        self.out.append(head)
        stream.pending = memoryview(b"\x00" + (size - 5).to_bytes(4, "big") + payload)
        stream.trailer = trailer
        self.blocked.append(stream)
        self._pump()

    def _pump(self) -> None:
        """Send queued response DATA as far as the connection and stream windows allow."""
        blocked = self.blocked
        for _ in range(len(blocked)):
            if self.send_window <= 0:
                return
            stream = blocked.popleft()
            pending = stream.pending
            if pending is None:  # reset meanwhile
                continue
            while pending and stream.send_window > 0 and self.send_window > 0:
                n = min(len(pending), stream.send_window, self.send_window, self.peer_max_frame)
                self.out.append(h2.frame_header(h2.DATA, 0, stream.sid, n))
                self.out.append(pending[:n].tobytes())
                pending = pending[n:]
                stream.send_window -= n
                self.send_window -= n
            if pending:
                stream.pending = pending
                blocked.append(stream)
            else:
                stream.pending = None
                self.out.append(stream.trailer)
                self._maybe_close(stream)

    def _maybe_close(self, stream: _Stream) -> None:
        """Forget a fully answered stream; if the client is still sending, tell it to stop."""
        if stream.pending is not None:
            return
        if self.streams.pop(stream.sid, None) is None:
            return
        if not stream.remote_closed:
            # RFC 7540 §8.1: a complete response may be followed by RST_STREAM(NO_ERROR).
            self.out.append(h2.rst_stream(stream.sid, h2.NO_ERROR))
        if self.draining and not self.streams and self.transport is not None:
            self._close()  # nothing more to write

    def _reset(self, stream: _Stream, code: int) -> None:
        stream.answered = True
        stream.pending = None
        if stream.timer is not None:
            stream.timer.cancel()
        self.streams.pop(stream.sid, None)
        self.out.append(h2.rst_stream(stream.sid, code))

    def drain(self) -> None:
        """Graceful shutdown: GOAWAY, finish the streams in flight, then close."""
        if self.transport is None or self.draining:
            return
        self.draining = True
        self.out.append(h2.goaway(self.last_sid, h2.NO_ERROR))
        if self.streams:
            self._flush()
        else:
            self._close()


def _response_headers(sid: int) -> bytes:
    return h2.frame_header(h2.HEADERS, h2.END_HEADERS, sid, len(h2.RESPONSE_HEADERS)) + h2.RESPONSE_HEADERS


_MAX_FRAME_RECEIVED = h2.DEFAULT_MAX_FRAME  # we advertise no larger SETTINGS_MAX_FRAME_SIZE


def _call_and_serialize(method: Method, request) -> tuple[bytes | None, Code, str]:
    response, code, message = method.call(request)
    return (None if response is None else method.response_serializer(response)), code, message


class LeanGrpcServer:
    """The gRPC server, on its own event loop thread; ``start``/``stop``/``wait_for_termination``
    mirror grpc.Server's so ``ModelServer`` drives either."""

    def __init__(self, core: ServingCore, reload_config: Callable, host: str, port: int, *,
                 max_threads: int, max_receive_bytes: int, reuse_port: bool = False,
                 guard: Callable[[LeanGrpcServer], tuple[Callable[[], asyncio.Protocol], dict]] | None = None,
                 repository=None):
        self.services = Services(core, reload_config, repository)  # repository: V2's extension (v2_repository)
        self.core = core
        self.host, self.port = host, port
        self.max_receive_bytes = max_receive_bytes
        self.reuse_port = reuse_port
        # ``secure_h2.grpc_guard``: (connection factory, TLS keywords) when security is on. Passed
        # in by the caller, so this plain transport never imports the module that subclasses it.
        self.guard = guard
        self.pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="grpc")
        self.connections: set[_Connection] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._aserver = None
        self._stopped = threading.Event()

    def runs_inline(self, model_name: str) -> bool:
        return self.core.manager.runs_inline(model_name)

    def bind(self) -> None:
        """Open the listening socket (raises OSError if the port is taken)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.reuse_port:  # worker processes share the port; the kernel spreads connections
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise bind_failure(exc, "gRPC", self.host, self.port) from None
        sock.listen(2048)
        self._sock = sock

    def start(self) -> None:
        if self._sock is None:
            self.bind()
        try:
            import uvloop

            self.loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover
            self.loop = asyncio.new_event_loop()
        self.writer = ResponseWriter(self.loop)
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                factory, tls = (lambda: _Connection(self)), {}
                if self.guard is not None:
                    factory, tls = self.guard(self)
                self._aserver = self.loop.run_until_complete(
                    self.loop.create_server(factory, sock=self._sock, backlog=2048, **tls))
            except BaseException as exc:  # pragma: no cover
                failure.append(exc)
                ready.set()
                return
            ready.set()
            try:
                self.loop.run_forever()
            finally:
                self.loop.close()
                self._stopped.set()

        self._thread = threading.Thread(target=run, name="grpc-h2", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]

    def stop(self, grace: float | None = None) -> None:
        """Stop accepting, send GOAWAY, let calls in flight finish for up to ``grace`` seconds."""
        loop = self.loop
        if loop is None or self._stopped.is_set() or loop.is_closed():
            return

        async def shutdown() -> None:
            self._aserver.close()
            for conn in list(self.connections):
                conn.drain()
            deadline = time.monotonic() + (grace or 0)
            while self.connections and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            for conn in list(self.connections):
                if conn.transport is not None:
                    conn._close()
            await asyncio.sleep(0)
            loop.stop()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop)
        except RuntimeError:  # the loop closed meanwhile
            return
        self._thread.join((grace or 0) + 5)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)
