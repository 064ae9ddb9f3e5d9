"""The Open Inference Protocol's (KServe V2) HTTP/REST API, beside TF Serving's on the REST port.

Routes ``/v2`` paths: health, server and model metadata, readiness, ``infer`` with JSON
tensors and the binary tensor data extension (``Inference-Header-Content-Length``), and
the model repository extension. Errors answer ``{"error": "..."}`` with the status of
their canonical code (``errors.HTTP_STATUS``, the one mapping). The transport hands over
the method, path, body and the binary header's value; the answer is
``(status, headers, body)`` since binary outputs need their own headers.
"""
from __future__ import annotations

import functools
import logging
import re
import time
from typing import Callable, NamedTuple
from urllib.parse import unquote

import orjson

from modelyard.errors import Code, ServingError, invalid_argument
from modelyard.serving.batching.scheduler import set_request_timeout
from modelyard.serving.protocol import v2_tensors
from modelyard.serving.protocol.v2_service import InferResult, V2Service

log = logging.getLogger("modelyard.serving")

_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?")
_REPOSITORY = re.compile(r"/v2/repository/(?:index|models/([^/]+)/(load|unload))")

HEADER_LENGTH = "inference-header-content-length"
LOOP_PARSE_MAX_BYTES = 64 * 1024  # JSON bodies up to this size are parsed on the event loop (rest.py's limit)
_JSON = [(b"content-type", b"application/json")]
_BINARY = [(b"content-type", b"application/octet-stream")]


def error_answer(error: ServingError, extra_headers: list) -> tuple[int, list, bytes]:
    return error.http_status, _JSON + extra_headers, orjson.dumps({"error": error.message})


class V2RestApp:
    """``handle(method, path, body, header_length)`` -> ``(status, headers, body)`` for every ``/v2`` path."""

    def __init__(self, service: V2Service, extra_headers: list | None = None, timeout_s: float | None = None,
                 repository=None, executor=None, json_headers: list | None = None):
        self.service = service
        self.executor = executor  # where the batching queue runs what it cannot on its own thread (RestApp.pool)
        self.extra_headers = extra_headers or []  # CORS, when the REST API sends it
        # RestApp's own list when it has one: the HTTP server keeps a ready head for that object.
        self.json_headers = json_headers if json_headers is not None else _JSON + self.extra_headers
        self.timeout_s = timeout_s
        self.repository = repository  # v2_repository.Repository, or None: the extension answers UNIMPLEMENTED
        self._routes: dict[str, tuple[str, str | None, str | None]] = {}  # path -> _model_route's answer

    @staticmethod
    def owns(path: str) -> bool:
        return path == "/v2" or path.startswith("/v2/")

    def cheap(self, path: str) -> bool:
        """Whether to answer on the event loop: health and server metadata (no model), and infer on a
        model that answers in microseconds (LiteRT, no batching), as TF Serving's REST path does."""
        if path in ("/v2", "/v2/health/live", "/v2/health/ready"):
            return True
        route = self._model_route(path)
        return route is not None and route[2] == "/infer" and self.service.core.manager.runs_inline(route[0])

    def _model_route(self, path: str) -> tuple[str, str | None, str | None] | None:
        """``(model name, version or None, "/ready" | "/infer" | None)`` of a ``/v2/models/...`` path, or None.
        Kept per path, as TF Serving's routes are (``RestApp._post_route``): a client sends the same few."""
        route = self._routes.get(path)
        if route is None:
            match = _MODEL.fullmatch(path)
            if match is None:
                return None
            version = match.group(2)
            if len(self._routes) >= 512:  # many distinct paths: a scan, not a client; stay small
                self._routes.clear()
            route = self._routes[path] = (unquote(match.group(1)), unquote(version) if version else None,
                                          match.group(3))
        return route

    def handle(self, method: str, path: str, body: bytes, header_length: bytes | None = None
               ) -> tuple[int, list, bytes]:
        set_request_timeout(self.timeout_s)
        try:
            return self._route(method, path, body, header_length)
        except ServingError as exc:
            return error_answer(exc, self.extra_headers)
        except Exception as exc:  # a bug answers 500 and the server keeps serving
            log.error("V2 REST request failed: %s %s", method, path, exc_info=exc)
            return error_answer(ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}"), self.extra_headers)

    def _json(self, status: int, value) -> tuple[int, list, bytes]:
        return status, self.json_headers, orjson.dumps(value)

    def _route(self, method: str, path: str, body: bytes, header_length) -> tuple[int, list, bytes]:
        service = self.service
        if method == "GET":
            if path == "/v2/health/live":
                return self._json(200, {"live": service.live()})
            if path == "/v2/health/ready":
                if service.ready():
                    return self._json(200, {"ready": True})
                raise ServingError(Code.UNAVAILABLE, "not every configured model has a version to serve yet")
            if path in ("/v2", "/v2/"):
                return self._json(200, service.server_metadata())
        route = self._model_route(path)
        if route is not None:
            name, version, action = route
            if method == "POST" and action == "/infer":
                return self._infer(name, version, body, header_length)
            if method == "GET" and action is None:
                return self._json(200, service.model_metadata(name, version))
            if method == "GET" and action == "/ready":
                if service.model_ready(name, version):
                    return self._json(200, {"name": name, "ready": True})
                raise ServingError(Code.UNAVAILABLE, f"model '{name}'"
                                   + (f" version {version}" if version else "") + " is not ready")
        match = _REPOSITORY.fullmatch(path)
        if match is not None and method == "POST":
            if self.repository is None:
                raise ServingError(Code.UNIMPLEMENTED, "the model repository extension is not enabled")
            return self._repository(match, body)
        raise ServingError(Code.NOT_FOUND, f"no V2 route for {method} {path}")

    # ---- infer ------------------------------------------------------------------------------
    def _infer(self, name: str, version: str | None, body: bytes, header_length) -> tuple[int, list, bytes]:
        inputs, requested, binary_outputs, request_id = read_infer(body, header_length)
        result = self.service.infer(name, version, inputs, requested, "REST")
        return self._infer_answer(request_id, result, binary_outputs)

    # ---- infer on a batching model: decoded on the event loop, answered from the queue ----------
    def submit(self, method: str, path: str, body: bytes, header_length: bytes | None):
        """Start an infer whose model batches, holding no thread while it waits in the queue (as
        ``RestApp.submit`` does for TF Serving's predicts, through the same ``queue_predict``).

        None when the request is not one, or is a JSON body too large to parse on the event loop
        (a binary body is sliced, not parsed: any size); ``(status, headers, body)`` when it is
        answered already; else a ``QueuedPredict`` to answer with ``finish_queued``."""
        if method != "POST" or (header_length is None and len(body) > LOOP_PARSE_MAX_BYTES):
            return None
        route = self._model_route(path)
        if route is None or route[2] != "/infer":
            return None
        name, version = route[0], route[1]

        def read():
            inputs, requested, binary_outputs, request_id = read_infer(body, header_length)
            return inputs, requested, lambda result: self._infer_answer(request_id, result, binary_outputs)

        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        try:
            return self.service.queue_infer(name, version, read, "REST", deadline, self.executor)
        except ServingError as exc:
            return error_answer(exc, self.extra_headers)
        except Exception as exc:  # a bug answers 500 and the server keeps serving
            log.error("V2 REST request failed: %s %s", method, path, exc_info=exc)
            return error_answer(ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}"), self.extra_headers)

    def finish_queued(self, queued) -> tuple[int, list, bytes]:
        """The answer to a ``submit``-ed infer once its future completed (call exactly once)."""
        try:
            return queued.finish()
        except ServingError as exc:
            return error_answer(exc, self.extra_headers)
        except Exception as exc:
            log.error("V2 REST infer failed", exc_info=exc)
            return error_answer(ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}"), self.extra_headers)

    def _infer_answer(self, request_id, result: InferResult, binary_outputs) -> tuple[int, list, bytes]:
        head, chunks = infer_answer(request_id, result, binary_outputs)
        if not chunks:
            return 200, self.json_headers, head
        headers = _BINARY + [(HEADER_LENGTH.encode(), str(len(head)).encode())] + self.extra_headers
        return 200, headers, b"".join([head, *chunks])

    # ---- the model repository extension -----------------------------------------------------
    def _repository(self, match, body: bytes) -> tuple[int, list, bytes]:
        request = _json_object(body) if body.strip() else {}
        name, action = match.group(1), match.group(2)
        if action is None:
            ready = bool(request.get("ready", False))
            return self._json(200, self.repository.index(ready_only=ready))
        name = unquote(name)
        if action == "load":
            self.repository.load(name)
        else:
            self.repository.unload(name)
        return self._json(200, {})


def _json_object(body: bytes) -> dict:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid_argument(f"malformed JSON request body: {exc}") from None
    if not isinstance(value, dict):
        raise invalid_argument("the request body must be a JSON object")
    return value


NO_ID = object()  # read_infer's request id when the request has none


def infer_answer(request_id, result: InferResult, binary_outputs) -> tuple[bytes, list[bytes]]:
    """The answer's JSON and the binary outputs after it. The JSON is what ``orjson.dumps`` writes for
    ``{"model_name", "model_version", "outputs": [{"name", "datatype", "shape", "data" | "parameters"}],
    "id"}``, its fixed parts written by orjson once per model version and per output name, datatype and
    shape: building the dicts every request cost more than writing the numbers."""
    tensors, chunks = [], []
    for alias, array in result.outputs.items():
        head = _tensor_head(alias, v2_tensors.output_datatype(array), array.shape)
        if binary_outputs(alias):
            raw = v2_tensors.to_raw(array)
            tensors.append(b'%s,"parameters":{"binary_data_size":%d}}' % (head, len(raw)))
            chunks.append(raw)
        else:
            tensors.append(b'%s,"data":%s}' % (head, orjson.dumps(v2_tensors.to_json_data(array),
                                                                  option=orjson.OPT_SERIALIZE_NUMPY)))
    tail = b"]}" if request_id is NO_ID else b'],"id":%s}' % orjson.dumps(request_id)
    return b"".join((_answer_head(result.model_name, result.model_version), b",".join(tensors), tail)), chunks


@functools.lru_cache(maxsize=256)
def _answer_head(model_name: str, version: int) -> bytes:
    return orjson.dumps({"model_name": model_name, "model_version": str(version)})[:-1] + b',"outputs":['


@functools.lru_cache(maxsize=1024)
def _tensor_head(alias: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    return orjson.dumps({"name": alias, "datatype": datatype, "shape": list(shape)})[:-1]


class _Plan(NamedTuple):
    """What ``read_infer`` learnt from a JSON request apart from its numbers, kept by the request's
    text with each input's ``data`` cut out: a client sends the same names, shapes and datatypes
    every time. Only what the general path checked and accepted is kept, and the numbers are still
    read and checked by the same function (``v2_tensors.from_checked_json``) on every request."""

    inputs: tuple  # (name, datatype, DataType enum, shape, index of its data array), in the request's order
    requested: list | None
    binary_outputs: Callable
    request_id: object


_PLANS: dict[bytes, _Plan] = {}
_PLANS_MAX = 256  # distinct request layouts (an "id" that changes every request makes each its own)


def read_infer(body: bytes, header_length: bytes | None) -> tuple[list, list | None, Callable, object]:
    """An infer request's ``(inputs, output names or None, whether an output answers in binary, id or NO_ID)``."""
    if header_length is None:
        spans = _data_arrays(body)
        if spans:
            marked, texts = _marked(body, spans)
            plan = _PLANS.get(marked)
            if plan is not None:
                return [v2_tensors.from_checked_json(name, datatype, enum, shape, texts[index])
                        for name, datatype, enum, shape, index in plan.inputs], \
                    plan.requested, plan.binary_outputs, plan.request_id
            request = _parse_marked(marked, texts)
            if request is None:
                request = _json_object(body)
            inputs = decode_inputs(request, memoryview(b""))
            requested, binary_outputs = requested_outputs(request)
            request_id = request.get("id", NO_ID)
            _remember(marked, request, texts, requested, binary_outputs, request_id)
            return inputs, requested, binary_outputs, request_id
    request, binary = split_body(body, header_length)
    inputs = decode_inputs(request, binary)
    requested, binary_outputs = requested_outputs(request)
    return inputs, requested, binary_outputs, request.get("id", NO_ID)


def _remember(marked: bytes, request: dict, texts: list, requested, binary_outputs, request_id) -> None:
    """Keep the plan of a request ``decode_inputs`` accepted whose every input's data is a cut-out array."""
    planned = []
    for tensor in request["inputs"]:
        data = tensor["data"] if "data" in tensor else None
        if not isinstance(data, v2_tensors.DataText):
            return
        index = next(i for i, text in enumerate(texts) if text is data)
        enum, shape = v2_tensors.check_header(tensor["name"], tensor["datatype"], tensor["shape"])
        planned.append((tensor["name"], tensor["datatype"], enum, shape, index))
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[marked] = _Plan(tuple(planned), requested, binary_outputs, request_id)


def split_body(body: bytes, header_length: bytes | None) -> tuple[dict, memoryview]:
    """The JSON request and the binary data after it (``Inference-Header-Content-Length`` bytes of JSON).
    Each input's ``data`` of numbers stays its JSON text (``v2_tensors.DataText``) where it can."""
    if header_length is None:
        return _request(body), memoryview(b"")
    text = header_length.decode("latin-1").strip()
    if not text.isdigit():
        raise invalid_argument(f"Inference-Header-Content-Length must be a byte count, got {text!r}")
    length = int(text)
    if length > len(body):
        raise invalid_argument(
            f"Inference-Header-Content-Length is {length} but the request body has only {len(body)} bytes")
    return _request(body[:length]), memoryview(body)[length:]


_MARK = "\x00data"  # stands for a cut-out array: {"\u0000data": its index}; no client key holds a NUL
_OPEN = re.compile(rb'"data"[ \t\r\n]*:[ \t\r\n]*\[')  # matched where bytes.find put it, never searched


def _data_arrays(body: bytes) -> list[tuple[int, int]]:
    """Where each ``"data": [...]`` array that holds no string or object lies in ``body``. Such an
    array ends at the last "]" before the next quote or brace; a wrong guess cannot parse (``_request``).
    Found with bytes.find, not a regular expression search: that read every digit in Python's engine
    (24 µs); the expression only checks the few bytes after each ``"data"`` the find lands on."""
    spans, at, find, opened = [], 0, body.find, _OPEN.match
    while (at := find(b'"data"', at)) >= 0:
        key = opened(body, at)
        if key is None:  # a string value "data", or a "data" key on something but an array
            at += 6
            continue
        start = key.end() - 1
        stop = find(b'"', start)
        if stop < 0:
            stop = len(body)
        brace = find(b"{", start, stop)  # searched up to the quote only: each is the first so far
        if brace >= 0:
            stop = brace
        brace = find(b"}", start, stop)
        if brace >= 0:
            stop = brace
        close = body.rfind(b"]", start, stop)
        if close > start:
            spans.append((start, close + 1))
            at = close + 1
        else:
            at = start
    return spans


def _request(body: bytes) -> dict:
    """The request object with each input's ``data`` array left as its text (``DataText``). The
    arrays are cut out and marked, the rest parsed; only when every mark is an input's ``data`` is
    that parse kept, else (a ``data`` key elsewhere, bad JSON) the body is parsed whole as sent."""
    spans = _data_arrays(body)
    if spans:
        request = _parse_marked(*_marked(body, spans))
        if request is not None:
            return request
    return _json_object(body)


def _marked(body: bytes, spans: list[tuple[int, int]]) -> tuple[bytes, list]:
    """``body`` with each span replaced by its mark, and the spans' texts."""
    pieces, texts, end = [], [], 0
    for i, (start, stop) in enumerate(spans):
        pieces += [body[end:start], b'{"\\u0000data":%d}' % i]
        texts.append(v2_tensors.DataText(body[start:stop]))
        end = stop
    pieces.append(body[end:])
    return b"".join(pieces), texts


def _parse_marked(marked: bytes, texts: list) -> dict | None:
    """The marked request parsed with its texts put back, or None when that is not what was sent."""
    try:
        request = orjson.loads(marked)
    except orjson.JSONDecodeError:
        return None
    return request if isinstance(request, dict) and _put_back(request, texts) else None


def _put_back(request: dict, texts: list) -> bool:
    """Replace each input's mark by its text; whether every mark was one (and only once)."""
    inputs = request.get("inputs")
    placed = set()
    for tensor in inputs if isinstance(inputs, list) else ():
        data = tensor.get("data") if isinstance(tensor, dict) else None
        if isinstance(data, dict) and len(data) == 1 and isinstance(data.get(_MARK), int) \
                and 0 <= data[_MARK] < len(texts) and data[_MARK] not in placed:
            placed.add(data[_MARK])
            tensor["data"] = texts[data[_MARK]]
    return len(placed) == len(texts)


def decode_inputs(request: dict, binary: memoryview) -> list[v2_tensors.V2Tensor]:
    """Every input tensor of a request, binary ones taking their bytes in order from ``binary``."""
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise invalid_argument("the request has no 'inputs' (a list of tensors)")
    tensors, offset = [], 0
    for tensor in inputs:
        if not isinstance(tensor, dict):
            raise invalid_argument("every input must be a JSON object with name, shape, datatype and data")
        name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
        parameters = tensor.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise invalid_argument(f"input '{name}': 'parameters' must be an object")
        size = parameters.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise invalid_argument(f"input '{name}': binary_data_size must be a byte count, got {size!r}")
            if offset + size > len(binary):
                raise invalid_argument(
                    f"input '{name}': binary_data_size {size} runs past the binary data, which has "
                    f"{len(binary) - offset} bytes left (Inference-Header-Content-Length set right?)")
            if "data" in tensor:
                raise invalid_argument(f"input '{name}' has both 'data' and binary_data_size")
            tensors.append(v2_tensors.from_raw(name, datatype, shape, binary[offset:offset + size]))
            offset += size
        else:
            if "data" not in tensor:
                raise invalid_argument(f"input '{name}' has neither 'data' nor binary_data_size")
            tensors.append(v2_tensors.from_json(name, datatype, shape, tensor["data"]))
    if offset != len(binary):
        raise invalid_argument(
            f"the request carries {len(binary)} bytes of binary data but its inputs declare {offset}")
    return tensors


def requested_outputs(request: dict):
    """``(output names or None for all, whether an output answers in binary)`` from a request."""
    parameters = request.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise invalid_argument("'parameters' must be an object")
    default_binary = bool(parameters.get("binary_data_output", False))
    outputs = request.get("outputs")
    if outputs is None:
        return None, lambda _alias: default_binary
    if not isinstance(outputs, list):
        raise invalid_argument("'outputs' must be a list of {\"name\": ...} objects")
    names, binary = [], {}
    for output in outputs:
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise invalid_argument("every requested output must be an object with a 'name'")
        names.append(output["name"])
        params = output.get("parameters") or {}
        binary[output["name"]] = bool(params.get("binary_data", default_binary)) if isinstance(params, dict) \
            else default_binary
    return (names or None), lambda alias: binary.get(alias, default_binary)
