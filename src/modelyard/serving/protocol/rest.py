"""TF Serving's REST API: routing, body limits, CORS, and the error mapping.

Protocol-free: ``http_server`` feeds it parsed requests. The hot path is parse body ->
core -> encode; models that answer in microseconds run on the event loop, others on
a thread pool so the loop keeps accepting connections. Predicts on a batching model are
parsed and checked on the loop, wait in the batching queue holding no thread, and are
encoded on the loop when their batch answers (``RestApp.submit``, ``RestApp.finish_queued``).
"""
from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

import orjson

from modelyard.errors import Code, ServingError, invalid_argument
from modelyard.model import dtypes
from modelyard.serving.protocol import rest_json
from modelyard.serving.protocol.v2_rest import LOOP_PARSE_MAX_BYTES, V2RestApp
from modelyard.serving.protocol.v2_service import V2Service
from modelyard.serving.batching.scheduler import set_request_timeout
from modelyard.serving.core import ModelSpec, ServingCore
from modelyard.model.signatures import DEFAULT_SIGNATURE

log = logging.getLogger("modelyard.serving")

_POST = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)", re.I)
_ON_DEMAND = "/v1/on_demand"
_GET = re.compile(r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(/metadata)?", re.I)

_JSON = [(b"content-type", b"application/json")]
_CORS = [
    (b"access-control-allow-origin", b"*"),
    (b"access-control-allow-methods", b"POST, GET"),
    (b"access-control-allow-headers", b"Content-Type"),
]


# Batched predicts are parsed on the event loop; a larger body is parsed on the pool (then waits there).
_LOOP_PARSE_MAX_BYTES = LOOP_PARSE_MAX_BYTES


class RestApp:
    def __init__(
        self,
        core: ServingCore,
        threads: int,
        timeout_ms: int = 0,
        max_body_bytes: int = 0,
        cors: bool = False,
        metrics_path: str | None = None,
        peer_metrics=None,
        json_numbers: str = dtypes.TF_SERVING_NUMBERS,
    ):
        self.core = core
        # How JSON numbers meet integer inputs (serve --json_numbers): with vertex, 0.0 reaches one as 0.
        self.integral_numbers = dtypes.integral_numbers(json_numbers)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rest")
        self.timeout_s = timeout_ms / 1000 if timeout_ms > 0 else None
        self.max_body_bytes = max_body_bytes
        self.extra_headers = _CORS if cors else []
        self.json_headers = _JSON + self.extra_headers
        self.json_heads: dict[int, bytes] = {}  # status -> response head up to the length (http_server)
        self.metrics_path = metrics_path
        self.peer_metrics = peer_metrics  # callable returning other workers' snapshots
        self.console = None  # modelyard.web.console.Console when the server serves /console
        # path -> (match, model name, ModelSpec or None when the path's version is malformed).
        # Clients send the same few paths, so each is parsed once, not per request.
        self._post_routes: dict[str, tuple] = {}
        # The Open Inference Protocol's /v2 paths (v2_rest.py), on the same port and models.
        self.v2 = V2RestApp(V2Service(core), self.extra_headers, self.timeout_s, executor=self.pool,
                            json_headers=self.json_headers)

    # ---- answered on the event loop, before or without the body ------------------------------
    def immediate(self, method: str, path: str) -> tuple[int, list, bytes] | None:
        """Responses that need no body and no model: CORS preflight, metrics, paths outside /v1/."""
        if method == "OPTIONS" and self.extra_headers:
            return 204, self.extra_headers, b""
        if self.metrics_path and path == self.metrics_path:
            peers = self.peer_metrics() if self.peer_metrics else []
            body = self.core.metrics.render(peers).encode()
            return 200, [(b"content-type", b"text/plain")] + self.extra_headers, body
        if self.console is not None and self.console.owns(path):
            return self.console.immediate(method, path)
        if not path.lower().startswith("/v1/") and not self.v2.owns(path):
            error = ServingError(Code.NOT_FOUND, f"Not found: {path}")
            return 404, self.json_headers, rest_json.error_body(error)
        return None

    def body_too_large(self) -> tuple[int, list, bytes]:
        message = (
            f"Request body exceeds the limit of {self.max_body_bytes} bytes; send smaller batches or raise "
            "--rest_api_max_body_bytes"
        )
        return 413, self.json_headers, orjson.dumps({"error": message})

    def deadline_exceeded(self) -> tuple[int, list, bytes]:
        # TF Serving passes the timeout to Session.run, whose error is TensorFlow's own words.
        error = ServingError(Code.DEADLINE_EXCEEDED, "Timed out waiting for notification")
        return error.http_status, self.json_headers, rest_json.error_body(error)

    def _post_route(self, path: str) -> tuple | None:
        route = self._post_routes.get(path)
        if route is None:
            match = _POST.fullmatch(path)
            if match is None:
                return None
            try:
                spec = self._spec(match)
            except ServingError:
                spec = None  # answered by _spec's error on every request
            if len(self._post_routes) >= 512:  # many distinct paths: a scan, not a client; stay small
                self._post_routes.clear()
            route = self._post_routes[path] = (match, unquote(match.group(1)), spec)
        return route

    def cheap(self, path: str) -> bool:
        """Whether this request's model runs fast enough to run on the event loop itself."""
        route = self._post_route(path)
        return route is not None and self.core.manager.runs_inline(route[1])

    # ---- runs on the thread pool (or inline, for cheap models) -------------------------------
    def handle(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        set_request_timeout(self.timeout_s)  # batching drops a request whose deadline passes in its queue
        try:
            if self.console is not None and self.console.owns(path):
                return self.console.handle(method, path, body)
            if method == "POST":
                route = self._post_route(path)
                if route is not None:
                    return 200, self._post(route[0], body, route[2])
            elif method == "GET":
                if path.startswith(_ON_DEMAND):  # modelyard's: a pool probe's view (serving/manager/on_demand)
                    return 200, self._on_demand(path)
                match = _GET.fullmatch(path)
                if match:
                    return 200, self._get(match)
            raise invalid_argument(f"Malformed request: {method} {path}")
        except Exception as exc:  # its own status for a ServingError; a bug answers 500, never kills the server
            return self._error_answer(exc, method, path)

    # ---- predict on a batching model: checked on the event loop, answered from the queue -------
    def submit(self, method: str, path: str, body: bytes):
        """Start a predict whose model batches, holding no thread while it waits in the queue.

        Returns None when the request is not one, or its body is too large to parse on the
        event loop (answer it with ``handle`` on the pool);
        ``(status, payload)`` when it is answered already (an error before the queue); else
        a ``QueuedPredict`` to answer with ``finish_queued``. Same checks, errors, metrics
        and answers as ``handle``.
        """
        if method != "POST" or len(body) > _LOOP_PARSE_MAX_BYTES:
            return None
        route = self._post_route(path)
        if route is None or route[2] is None or route[0].group(4).lower() != "predict":
            return None

        def read_request(handle):
            signature_name, key, payload = rest_json.parse_predict(body)
            sig, inputs = _predict_inputs(handle, signature_name, key, payload, self.integral_numbers)
            instances = key == "instances"
            return sig.name, inputs, lambda _queued, outputs: rest_json.predict_body(outputs, instances)

        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        try:
            return self.core.queue_predict(route[2], "predict", "REST", read_request, deadline=deadline,
                                           executor=self.pool)
        except BaseException as exc:
            return self._error_answer(exc, method, path)

    def finish_queued(self, queued, method: str, path: str) -> tuple[int, bytes]:
        """The answer to a ``submit``-ed predict once its future completed (call exactly once)."""
        try:
            return 200, queued.finish()
        except BaseException as exc:
            return self._error_answer(exc, method, path)

    @staticmethod
    def _error_answer(exc: BaseException, method: str, path: str) -> tuple[int, bytes]:
        """TF Serving's REST answer to an error: its own status, or 500 for a bug (logged)."""
        if isinstance(exc, ServingError):
            return exc.http_status, rest_json.error_body(exc)
        if not isinstance(exc, Exception):
            raise exc
        log.error("REST request failed: %s %s", method, path, exc_info=exc)
        error = rest_json.internal_error(exc)
        return error.http_status, rest_json.error_body(error)

    def _spec(self, match) -> ModelSpec:
        name, version, label = match.group(1), match.group(2), match.group(3)
        if name is None:
            raise invalid_argument("Missing model name in request.")
        if version is not None:
            try:
                version_number = int(version)
                if version_number >= 2**63:
                    raise ValueError
            except ValueError:
                raise invalid_argument(f"Failed to convert version: {version} to numeric.") from None
        return ModelSpec(unquote(name), int(version) if version else None, unquote(label) if label else None)

    def _post(self, match, body: bytes, spec: ModelSpec | None = None) -> bytes:
        if spec is None:
            spec = self._spec(match)
        api = match.group(4).lower()
        core = self.core
        with core.request(spec.name, api, "REST"):
            if api == "predict":
                signature_name, key, payload = rest_json.parse_predict(body)
                with core.acquire(spec) as handle:
                    sig, inputs = _predict_inputs(handle, signature_name, key, payload, self.integral_numbers)
                    _, outputs = core.predict(handle, sig.name, inputs)
                return rest_json.predict_body(outputs, key == "instances")
            signature_name, examples = rest_json.parse_examples(body, api)
            with core.acquire(spec) as handle:
                if api == "classify":
                    _, result = core.classify(handle, signature_name, examples)
                    return rest_json.classify_body(result.classes, result.scores, len(examples))
                _, values = core.regress(handle, signature_name, examples)
                return rest_json.regress_body(values)

    def _on_demand(self, path: str) -> bytes:
        """``GET /v1/on_demand[?since=SEQ]``: the on-demand state, only what changed after ``SEQ`` if given."""
        on_demand = self.core.manager.on_demand
        rest, _, query = path.partition("?")
        if rest != _ON_DEMAND or on_demand is None:
            raise invalid_argument(f"Malformed request: GET {path}" if rest != _ON_DEMAND else
                                   "this server does not load models on demand (--load_models_on_demand)")
        since = None
        for key, _, value in (part.partition("=") for part in query.split("&") if part):
            if key == "since":
                try:
                    since = int(value)
                except ValueError:
                    raise invalid_argument(f"since must be an integer, got {value!r}") from None
        return orjson.dumps(on_demand.state(since))

    def _get(self, match) -> bytes:
        if not any(match.groups()):  # GET /v1/models: modelyard's listing (TF Serving answers 400)
            listing: dict = {"models": [
                {"name": name, "version_labels": {label: str(v) for label, v in sorted(labels.items())},
                 "model_version_status": _status_json(statuses)}
                for name, labels, statuses in self.core.list_models()
            ]}
            if self.core.manager.on_demand is not None:  # what is loaded, what made room (serving/manager/on_demand)
                listing["on_demand"] = self.core.manager.on_demand.state()
            return orjson.dumps(listing)
        spec = self._spec(match)
        if match.group(4):
            return metadata_json(self.core, spec)
        return orjson.dumps({"model_version_status": _status_json(self.core.status(spec.name, spec.version))})


def _status_json(statuses) -> list[dict]:
    """GetModelStatus's JSON form of each version's state, as TF Serving writes it."""
    return [
        {
            "version": str(s.version),
            "state": s.state,
            "status": {"error_code": s.error_code, "error_message": s.error_message},
        }
        for s in statuses
    ]


def _predict_inputs(handle, signature_name: str | None, key: str, payload, integral: bool = False):
    """The signature a REST predict names and its inputs as arrays (``predict`` checks them further)."""
    sig = handle.servable.signatures.get(signature_name or DEFAULT_SIGNATURE)
    if sig is None:
        raise invalid_argument(
            f'Serving signature name: "{signature_name or DEFAULT_SIGNATURE}" not found in signature def'
        )
    return sig, rest_json.predict_inputs(key, payload, sig, integral)


def metadata_json(core: ServingCore, spec: ModelSpec) -> bytes:
    from google.protobuf import json_format

    version, sig_map = core.signature_defs(spec)
    signature_defs = json_format.MessageToDict(
        sig_map, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )
    return orjson.dumps(
        {
            "model_spec": {"name": spec.name, "signature_name": "", "version": str(version)},
            "metadata": {"signature_def": signature_defs},
        }
    )
