"""The gateway: ``:predict`` / ``:rawPredict`` on an endpoint, forwarded to one replica.

The deployed model comes from the endpoint's split (or a pinning header), the replica is the one
with the fewest requests in flight, and the body goes to the replica's TF Serving ``:predict``
as received (Vertex's ``{"instances": ...}`` is TF Serving's row format). The replica's answer is
extended in place with Vertex's ``deployedModelId`` / ``model`` / ``modelVersionId``, not re-parsed.
A predict that fails to reach a replica (refused, reset, replica killed), or gets no answer within
its deadline (``deadlines``: derived from the model's recent answer times; a stuck replica), is
retried on another: predicts are idempotent.

The Open Inference Protocol (KServe V2) takes the same way: ``/v2/models/{name}/infer`` (``name`` a
deployed model id, or an endpoint id whose split picks one; also under ``/v1/.../endpoints/E``) goes
to the replica's own V2 ``infer`` as received, binary tensor data included, and its answer comes back
with the client's model name; a ``:rawPredict`` whose body is a V2 request does too. V2 infers are not
mirrored to shadows (their agreement compares TF Serving answers).
"""
from __future__ import annotations

import asyncio
import re
import time

import orjson

from modelyard import __version__
from modelyard.platform.dataplane import v2_paths
from modelyard.platform.dataplane.deadlines import DeadlinePolicy, LatencyWindow
from modelyard.platform.api.errors import STATUS, ApiError
from modelyard.platform.dataplane.routing import Deployed, Routing
from modelyard.platform.dataplane.upstream import UpstreamTimeout

PIN_HEADER = "X-Modelyard-Deployed-Model-Id"
MAX_ATTEMPTS = 4
NO_REPLICA_WAIT_S = 30.0  # how long a request waits for a replica while one is being replaced
MAX_SHADOW_IN_FLIGHT = 64
_JSON = ((b"Content-Type", b"application/json"),)
V2_SERVER_NAME = "modelyard-platform"
_V2_HEADER_LENGTH = b"inference-header-content-length"
_V2_ANSWER_HEADERS = (b"content-type", _V2_HEADER_LENGTH)

# TF Serving's HTTP status -> Google status of the error relayed to the client.
_RELAYED = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
            503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


class Gateway:
    def __init__(self, routing: Routing, metrics=None, deadlines: DeadlinePolicy = DeadlinePolicy()) -> None:
        self.routing = routing
        self.metrics = metrics
        self.deadlines = deadlines
        self._latency: dict[str, LatencyWindow] = {}  # deployed model id -> its recent answer times
        # set by the supervisor: called with the failed Replica and the ConnectionError (UpstreamTimeout: stuck?)
        self.on_replica_failure = None
        self._shadow_tasks: set[asyncio.Task] = set()

    async def close(self) -> None:
        for d in self.routing.deployed.values():
            for r in d.replicas:
                if r.upstream is not None:
                    r.upstream.close()

    async def predict(self, endpoint_id: str, parent: str, body: bytes, pinned: str | None,
                      raw: bool, header_length: bytes | None = None) -> tuple[int, bytes, dict[str, str]]:
        """(HTTP status, body, extra headers) of one predict through the endpoint. A ``:rawPredict``
        whose body is a V2 infer request (``header_length``: its Inference-Header-Content-Length)
        goes to the replica's V2 ``infer`` as received, and its answer comes back as sent."""
        started = time.perf_counter()
        d, shadows = self.routing.choose_deployed(endpoint_id, parent, pinned)
        if raw and v2_paths.is_v2_body(body, header_length):
            return await self._raw_v2(d, body, header_length, started)
        if not raw and b'"parameters"' in body:
            body = _without_parameters(body)
        status, data = await self._forward(d, body)
        if self.metrics is not None:
            self.metrics.observe_predict(d, status, time.perf_counter() - started)
        if status != 200:
            raise _relayed_error(status, data)
        for shadow in shadows:
            self._mirror(shadow, body, data)
        headers = _vertex_headers(d)
        if raw:
            return 200, data, headers
        return 200, _with_vertex_fields(data, d), headers

    async def _raw_v2(self, d: Deployed, body: bytes, header_length: bytes | None,
                      started: float) -> tuple[int, bytes, dict[str, str]]:
        """``:rawPredict`` with a V2 body: the replica's V2 answer as it sent it (JSON or binary)."""
        sent, answer = _v2_request_headers(header_length), []
        status, data = await self._forward(d, body, target=d.v2_infer_path, headers=sent, answer_headers=answer)
        if self.metrics is not None:
            self.metrics.observe_predict(d, status, time.perf_counter() - started)
        if status != 200:
            raise _relayed_error(status, data)
        headers = _vertex_headers(d)
        for name, value in answer:
            if name.lower() in _V2_ANSWER_HEADERS:
                headers[name.decode("latin-1")] = value.decode("latin-1")
        return 200, data, headers

    # ---- the Open Inference Protocol (KServe V2) on the gateway's /v2 routes -----------------------
    async def v2(self, call: v2_paths.V2Call, body: bytes, header_length: bytes | None
                 ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """(status, headers, body) of one V2 call: health and server metadata answered here, a model's
        readiness, metadata and infer by a replica of the deployed model it names (an endpoint's name:
        its traffic split picks one). Errors raise ``ApiError`` (the caller answers V2's body)."""
        kind = call.kind
        if kind is None:
            raise ApiError("NOT_FOUND", f"no Open Inference Protocol route for {call.path}; the platform answers "
                           "/v2/health/live|ready, /v2, /v2/models/{name}[/versions/{v}][/ready|/infer]")
        if kind == v2_paths.LIVE:
            return 200, list(_JSON), b'{"live":true}'
        if kind == v2_paths.READY:
            if not self._v2_ready(call):
                raise ApiError("UNAVAILABLE", "no deployed model has a live replica yet"
                               if call.endpoint_id is None else
                               f"endpoint {call.endpoint_id} has no deployed model with a live replica yet")
            return 200, list(_JSON), b'{"ready":true}'
        if kind == v2_paths.SERVER:
            return 200, list(_JSON), orjson.dumps({"name": V2_SERVER_NAME, "version": __version__,
                                                   "extensions": ["binary_tensor_data"]})
        started = time.perf_counter()
        d = self.routing.v2_deployed(call.name, call.endpoint_id, call.parent)
        if call.version is not None and call.version != d.version_id:
            raise ApiError("NOT_FOUND", f"model '{call.name}' has no version {call.version}: the deployed model "
                           f"{d.id} serves version {d.version_id} of {d.model}")
        identity = _vertex_headers(d)
        extra = [(k.encode(), v.encode()) for k, v in identity.items()]
        if kind == v2_paths.MODEL_READY:
            ready = any(r.unready_since is None for r in d.live())
            if not ready:
                raise ApiError("UNAVAILABLE", f"model '{call.name}' (deployed model {d.id}) has no ready replica")
            return 200, list(_JSON) + extra, orjson.dumps({"name": call.name, "ready": True})
        answer: list = []
        if kind == v2_paths.MODEL_METADATA:
            status, data = await self._forward(d, b"", target=d.v2_model_path, headers=(), method=b"GET",
                                               answer_headers=answer)
            if status != 200:
                raise _v2_relayed(status, data)
            meta = orjson.loads(data)
            meta.update(name=call.name, versions=[d.version_id])
            return 200, list(_JSON) + extra, orjson.dumps(meta)
        status, data = await self._forward(d, body, target=d.v2_infer_path, headers=_v2_request_headers(header_length),
                                           answer_headers=answer)
        if self.metrics is not None:
            self.metrics.observe_predict(d, status, time.perf_counter() - started)
        if status != 200:
            raise _v2_relayed(status, data)
        headers, data = _v2_renamed(answer, data, call.name, d.version_id)
        return 200, headers + extra, data

    def _v2_ready(self, call: v2_paths.V2Call) -> bool:
        if call.endpoint_id is None:
            return any(d.live() for d in self.routing.deployed.values())
        ep = self.routing.endpoints.get(call.endpoint_id)
        return ep is not None and ep.parent == call.parent and any(d.live() for d in ep.deployed.values())

    def _mirror(self, shadow: Deployed, body: bytes, served: bytes) -> None:
        """Send a copy to ``shadow`` in the background; its answer is only compared, never returned."""
        if len(self._shadow_tasks) >= MAX_SHADOW_IN_FLIGHT:
            return  # shadows never slow the served path: past the cap, requests are not mirrored
        task = asyncio.get_running_loop().create_task(self._shadow(shadow, body, served))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    async def _shadow(self, shadow: Deployed, body: bytes, served: bytes) -> None:
        try:
            status, data = await self._forward(shadow, body, wait_s=0.0)
        except ApiError:
            status, data = 503, b""
        agreed, diff = compare(served, data) if status == 200 else (None, 0.0)
        if self.metrics is not None:
            self.metrics.observe_shadow(shadow, agreed, diff)

    async def _forward(self, d: Deployed, body: bytes, wait_s: float = NO_REPLICA_WAIT_S,
                       target: bytes | None = None, headers=_JSON, method: bytes = b"POST",
                       answer_headers: list | None = None) -> tuple[int, bytes]:
        """(status, body) of the replica that answered; its headers are appended to ``answer_headers``."""
        tried: set[int] = set()
        deadline = time.monotonic() + wait_s
        attempts = 0
        latency = self._latency.get(d.id)
        if latency is None:
            latency = self._latency[d.id] = LatencyWindow(self.deadlines)
            self._prune()
        last_error = "no replica"
        while True:
            replica = self.routing.choose_replica(d, tried)
            if replica is None:
                if attempts >= MAX_ATTEMPTS or time.monotonic() > deadline or d.id not in self.routing.deployed:
                    raise ApiError("UNAVAILABLE", f"deployed model {d.id} has no live replica ({last_error}); "
                                   "retry shortly")
                tried.clear()  # wait for a replacement, then try every live replica again
                await asyncio.sleep(0.05)
                continue
            attempts += 1
            replica.outstanding += 1
            # The first attempt waits as long as this model's answers take lately; a retry, the full limit.
            timeout = latency.first_attempt_s() if attempts == 1 else self.deadlines.max_s
            sent = time.monotonic()
            try:
                status, rheaders, data = await replica.connections().request(
                    method, target or d.predict_path, body, headers, timeout=timeout)
            except ConnectionError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
                tried.add(id(replica))
                if self.on_replica_failure is not None:
                    self.on_replica_failure(replica, exc)
                continue
            finally:
                replica.outstanding -= 1
            if status == 200:
                latency.observe(time.monotonic() - sent)
            if status == 503 and attempts < MAX_ATTEMPTS:
                tried.add(id(replica))  # a replica shutting down; another may answer
                continue
            replica.served += 1
            if answer_headers is not None:
                answer_headers.extend(rheaders)
            return status, data


    def _prune(self) -> None:
        """Forget the answer times of models no longer deployed (checked when a new one appears)."""
        for dm_id in [k for k in self._latency if k not in self.routing.deployed]:
            del self._latency[dm_id]


def compare(served: bytes, shadow: bytes) -> tuple[bool | None, float]:
    """(agreed, max abs difference) of two TF Serving answers. Agreed: same shape and, per instance,
    the same top-scoring output (the same class); None when the shadow's answer is unreadable."""
    import numpy as np

    try:
        a = np.asarray(orjson.loads(served)["predictions"], dtype=np.float64)
        b = np.asarray(orjson.loads(shadow)["predictions"], dtype=np.float64)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None, 0.0
    if a.shape != b.shape:
        return False, float("inf")
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    if a.ndim >= 2:
        agreed = bool(np.array_equal(a.reshape(len(a), -1).argmax(axis=1), b.reshape(len(b), -1).argmax(axis=1)))
    else:
        agreed = bool(np.allclose(a, b, rtol=1e-5, atol=1e-6))
    return agreed, diff


def _with_vertex_fields(data: bytes, d: Deployed) -> bytes:
    end = data.rstrip()
    if not end.endswith(b"}"):
        raise ApiError("INTERNAL", "replica answered a body that is not a JSON object")
    extra = orjson.dumps({"deployedModelId": d.id, "model": d.model, "modelVersionId": d.version_id,
                          "modelDisplayName": d.display_name})
    return end[:-1] + b"," + extra[1:]


def _without_parameters(body: bytes) -> bytes:
    """Vertex's ``parameters`` have no TF Serving equivalent: dropped (the only case that re-parses)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body  # the replica reports the malformed JSON
    if isinstance(doc, dict):
        doc.pop("parameters", None)
    return orjson.dumps(doc)


def _vertex_headers(d: Deployed) -> dict[str, str]:
    return {"X-Vertex-AI-Deployed-Model-Id": d.id, "X-Vertex-AI-Model": d.model,
            "X-Vertex-AI-Model-Version-Id": d.version_id}


def _v2_request_headers(header_length: bytes | None) -> tuple:
    if header_length is None:
        return _JSON
    return ((b"Content-Type", b"application/octet-stream"), (_V2_HEADER_LENGTH, header_length))


# The replica's V2 answer starts with the model's name and version as it serves them (orjson keeps the
# key order V2RestApp writes); the gateway puts the client's name and the Vertex version in their place.
_V2_ANSWER_HEAD = re.compile(rb'^\{"model_name":"[^"]*","model_version":"[^"]*"')


def _v2_renamed(rheaders: list, data: bytes, name: str, version: str) -> tuple[list, bytes]:
    """The replica's infer answer (JSON, or JSON then binary outputs) with the client's model name."""
    head = _V2_ANSWER_HEAD.match(data)
    delta = 0
    if head is not None:
        new = b'{"model_name":' + orjson.dumps(name) + b',"model_version":' + orjson.dumps(version)
        delta = len(new) - head.end()
        data = new + data[head.end():]
    headers = []
    for key, value in rheaders:
        lower = key.lower()
        if lower == _V2_HEADER_LENGTH:
            value = str(int(value) + delta).encode()
        if lower in _V2_ANSWER_HEADERS:
            headers.append((key, value))
    return headers, data


def _v2_relayed(status: int, data: bytes) -> ApiError:
    """A replica's V2 error (``{"error": "..."}``) as the platform's ApiError, its status kept."""
    try:
        message = orjson.loads(data).get("error") or data.decode(errors="replace")
    except (orjson.JSONDecodeError, AttributeError):
        message = data.decode(errors="replace")[:500]
    code = next((name for name, (_, http) in STATUS.items() if http == status), "INTERNAL")
    return ApiError(code, str(message), http_status=status)


def _relayed_error(status: int, data: bytes) -> ApiError:
    try:
        message = orjson.loads(data).get("error") or data.decode(errors="replace")
    except (orjson.JSONDecodeError, AttributeError):
        message = data.decode(errors="replace")[:500]
    return ApiError(_RELAYED.get(status, "INTERNAL"), f"prediction failed: {message}")
