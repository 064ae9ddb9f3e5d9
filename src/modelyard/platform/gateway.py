"""The gateway: ``:predict`` / ``:rawPredict`` on an endpoint, forwarded to one replica.

The deployed model comes from the endpoint's split (or a pinning header), the replica is the one
with the fewest requests in flight, and the body goes to the replica's TF Serving ``:predict``
as received (Vertex's ``{"instances": ...}`` is TF Serving's row format). The replica's answer is
extended in place with Vertex's ``deployedModelId`` / ``model`` / ``modelVersionId``, not re-parsed.
A predict that fails to reach a replica (refused, reset, replica killed), or gets no answer within
its deadline (``deadlines``: derived from the model's recent answer times; a stuck replica), is
retried on another: predicts are idempotent.
"""
from __future__ import annotations

import asyncio
import time

import orjson

from modelyard.platform.deadlines import DeadlinePolicy, LatencyWindow
from modelyard.platform.errors import ApiError
from modelyard.platform.routing import Deployed, Routing
from modelyard.platform.upstream import UpstreamTimeout

PIN_HEADER = "X-Modelyard-Deployed-Model-Id"
MAX_ATTEMPTS = 4
NO_REPLICA_WAIT_S = 30.0  # how long a request waits for a replica while one is being replaced
MAX_SHADOW_IN_FLIGHT = 64
_JSON = ((b"Content-Type", b"application/json"),)

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
                      raw: bool) -> tuple[int, bytes, dict[str, str]]:
        """(HTTP status, body, extra headers) of one predict through the endpoint."""
        started = time.perf_counter()
        d, shadows = self.routing.choose_deployed(endpoint_id, parent, pinned)
        if not raw and b'"parameters"' in body:
            body = _without_parameters(body)
        status, data = await self._forward(d, body)
        if self.metrics is not None:
            self.metrics.observe_predict(d, status, time.perf_counter() - started)
        if status != 200:
            raise _relayed_error(status, data)
        for shadow in shadows:
            self._mirror(shadow, body, data)
        headers = {"X-Vertex-AI-Deployed-Model-Id": d.id, "X-Vertex-AI-Model": d.model,
                   "X-Vertex-AI-Model-Version-Id": d.version_id}
        if raw:
            return 200, data, headers
        return 200, _with_vertex_fields(data, d), headers

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

    async def _forward(self, d: Deployed, body: bytes, wait_s: float = NO_REPLICA_WAIT_S) -> tuple[int, bytes]:
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
                status, _, data = await replica.connections().request(b"POST", replica.PREDICT_PATH, body, _JSON,
                                                                      timeout=timeout)
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


def _relayed_error(status: int, data: bytes) -> ApiError:
    try:
        message = orjson.loads(data).get("error") or data.decode(errors="replace")
    except (orjson.JSONDecodeError, AttributeError):
        message = data.decode(errors="replace")[:500]
    return ApiError(_RELAYED.get(status, "INTERNAL"), f"prediction failed: {message}")
