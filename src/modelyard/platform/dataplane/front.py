"""The platform's public HTTP server: a lean httptools/asyncio front that answers endpoint
``:predict`` / ``:rawPredict`` and the Open Inference Protocol's ``/v2`` calls (at the root and under
an endpoint) itself, through the gateway, and passes every other request, as received, to the API
app (aiohttp) listening on a private local port.

Predicts are the hot path, so they skip the web framework entirely; the API app keeps the
framework's conveniences for the rest, where a request's cost does not matter.
"""
from __future__ import annotations

import asyncio
import logging
import re

import httptools
import orjson

from modelyard.platform.api import fields, http_limits
from modelyard.platform.dataplane import v2_paths
from modelyard.platform.api.errors import ApiError, check_bearer
from modelyard.platform.dataplane.upstream import Upstream

log = logging.getLogger(__name__)

_PREDICT = re.compile(rb"^/v1/projects/([^/]+)/locations/([^/]+)/endpoints/([0-9]{1,30}):(predict|rawPredict)(\?.*)?$")
_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host", b"upgrade"}
_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
            409: b"Conflict", 429: b"Too Many Requests", 499: b"Client Closed Request", 500: b"Internal Server Error",
            413: b"Payload Too Large", 501: b"Not Implemented", 503: b"Service Unavailable", 504: b"Gateway Timeout"}


def _response(status: int, body: bytes, headers: list[tuple[bytes, bytes]], keep_alive: bool) -> bytes:
    out = [b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n" % (status, _REASONS.get(status, b"OK"), len(body))]
    for name, value in headers:
        out.append(name + b": " + value + b"\r\n")
    if not keep_alive:
        out.append(b"Connection: close\r\n")
    out.append(b"\r\n")
    return b"".join(out) + body


# How long a connection whose body was refused keeps draining (and dropping) what the client still sends
# before it closes: a close with unread data resets the connection, and the client could lose the answer.
_REFUSED_LINGER_S = 1.0


class _Request:
    __slots__ = ("url", "method", "headers", "body", "keep_alive", "size", "limit", "refused")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.size = 0
        self.limit = 0
        self.refused: ApiError | None = None  # a body over the limit: answered without reading it whole


class FrontProtocol(asyncio.Protocol):
    def __init__(self, front: "Front") -> None:
        self.front = front
        self.parser = httptools.HttpRequestParser(self)
        self.transport = None
        self.current: _Request | None = None
        self.queue: asyncio.Queue | None = None
        self.worker: asyncio.Task | None = None
        self.refusing = False  # a body was refused: the rest of what arrives is dropped, then the connection ends

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.queue = asyncio.Queue()
        self.worker = asyncio.get_running_loop().create_task(self._serve())

    def connection_lost(self, exc) -> None:
        self.queue.put_nowait(None)

    def data_received(self, data: bytes) -> None:
        if self.refusing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            err = ApiError("INVALID_ARGUMENT", "malformed HTTP request")
            self.transport.write(_response(400, orjson.dumps(err.to_body()),
                                           [(b"Content-Type", b"application/json")], False))
            self.transport.close()

    def on_message_begin(self) -> None:
        self.current = _Request()

    def on_url(self, url: bytes) -> None:
        self.current.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers.append((name, value))

    def on_headers_complete(self) -> None:
        """A body declared larger than this route takes is refused now, before any of it is read."""
        r = self.current
        r.limit = self.front.body_limit(r.url)
        for name, value in r.headers:
            if name.lower() == b"content-length" and value.strip().isdigit() and int(value) > r.limit:
                self._refuse(r, int(value))

    def on_body(self, body: bytes) -> None:
        r = self.current
        if r.refused is not None:
            return
        r.size += len(body)
        if r.size > r.limit:  # no (or a false) Content-Length: refused as soon as the limit is passed
            self._refuse(r, None)
            return
        r.body.append(body)

    def _refuse(self, r: _Request, declared: int | None) -> None:
        predict = r.limit == self.front.p.config.max_predict_bytes
        r.refused = fields.too_large(declared, r.limit, "--max-predict-bytes" if predict else "--max-request-bytes")
        r.body = []
        r.method = self.parser.get_method()
        r.keep_alive = False
        self.refusing = True
        self.queue.put_nowait(r)  # answered in turn, after the requests before it

    def on_message_complete(self) -> None:
        r = self.current
        if r.refused is not None:
            return  # queued already, by _refuse
        r.method = self.parser.get_method()
        r.keep_alive = self.parser.should_keep_alive()
        self.queue.put_nowait(r)

    async def _serve(self) -> None:
        """Answers this connection's requests in order (HTTP/1.1 pipelining keeps its order)."""
        while True:
            r = await self.queue.get()
            if r is None:
                return
            self.front.active += 1
            try:
                with http_limits.handling(self.transport):  # never closed to make room while being answered
                    status, headers, body = await self.front.handle(r)
                if self.transport.is_closing():
                    return
                self.transport.write(_response(status, body, headers, r.keep_alive))
            finally:
                self.front.active -= 1
            if r.refused is not None:
                asyncio.get_running_loop().call_later(_REFUSED_LINGER_S, self.transport.close)
                return
            if not r.keep_alive:
                self.transport.close()
                return


class Front:
    def __init__(self, platform, api_host: str, api_port: int) -> None:
        self.p = platform
        self.api = Upstream(api_host, api_port)
        self.active = 0  # requests being answered: a stopping data plane waits for them

    def body_limit(self, url: bytes) -> int:
        """Predict bodies (V2 infers too) have their limit; every other request is a control-plane one."""
        if _PREDICT.match(url) or (b"/v2" in url and v2_paths.parse(url, b"POST") is not None):
            return self.p.config.max_predict_bytes
        return self.p.config.max_request_bytes

    async def handle(self, r: _Request):
        v2 = v2_paths.parse(r.url, r.method) if b"/v2" in r.url else None
        body_of = ApiError.to_v2_body if v2 is not None else ApiError.to_body  # the protocol's error body
        if r.refused is not None:
            return r.refused.http_status, [(b"Content-Type", b"application/json")], orjson.dumps(body_of(r.refused))
        if v2 is not None:
            return await self._answered(r, self._v2(r, v2), body_of)
        m = _PREDICT.match(r.url) if r.method == b"POST" else None
        if m is None:
            return await self._pass(r)
        return await self._answered(r, self._predict(r, m), body_of)

    async def _answered(self, r: _Request, work, body_of):
        """``work``'s answer, or its error in the protocol's body (``body_of``: Google's or V2's); a bug
        too is answered so, logged, and the platform keeps serving."""
        try:
            return await work
        except ApiError as exc:
            return exc.http_status, [(b"Content-Type", b"application/json")], orjson.dumps(body_of(exc))
        except Exception as exc:
            log.exception("%s %s failed", r.method.decode(), r.url)
            err = ApiError("INTERNAL", f"internal error: {type(exc).__name__}: {exc}")
            return 500, [(b"Content-Type", b"application/json")], orjson.dumps(body_of(err))

    async def _predict(self, r: _Request, m):
        project, location, endpoint_id, verb = (g.decode() for g in m.groups()[:4])
        pinned, token, header_length = self._predict_headers(r)
        if self.p.config.auth_predict:
            self._check_token(token)
        status, body, extra = await self.p.gateway.predict(
            endpoint_id, f"projects/{project}/locations/{location}", b"".join(r.body), pinned,
            verb == "rawPredict", header_length)
        headers = [(b"Content-Type", b"application/json")] + [(k.encode(), v.encode()) for k, v in extra.items()]
        return status, headers, body

    @staticmethod
    def _predict_headers(r: _Request) -> tuple[str | None, bytes | None, bytes | None]:
        """(pinned deployed model id, Authorization, V2's Inference-Header-Content-Length) of a predict."""
        pinned = token = header_length = None
        for name, value in r.headers:
            lname = name.lower()
            if lname == b"x-modelyard-deployed-model-id":
                pinned = value.decode()
            elif lname == b"authorization":
                token = value
            elif lname == b"inference-header-content-length":
                header_length = value
        return pinned, token, header_length

    async def _v2(self, r: _Request, call: v2_paths.V2Call):
        """An Open Inference Protocol call: the gateway's answer (errors: ``_answered``, in V2's body)."""
        _, token, header_length = self._predict_headers(r)
        if self.p.config.auth_predict and call.kind not in (v2_paths.LIVE, v2_paths.READY):
            self._check_token(token)
        return await self.p.gateway.v2(call, b"".join(r.body), header_length)

    def _check_token(self, given: bytes | None) -> None:
        check_bearer(self.p.config.auth_token, given)

    async def _pass(self, r: _Request):
        headers = [(k, v) for k, v in r.headers if k.lower() not in _HOP]
        try:
            status, rheaders, body = await self.api.request(r.method, r.url, b"".join(r.body), headers)
        except ConnectionError as exc:
            err = ApiError("UNAVAILABLE", f"the platform's API is not answering: {exc}")
            return 503, [(b"Content-Type", b"application/json")], orjson.dumps(err.to_body())
        return status, [(k, v) for k, v in rheaders if k.lower() not in _HOP and k.lower() != b"date"], body
