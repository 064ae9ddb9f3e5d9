"""The Open Inference Protocol's (KServe V2) HTTP/REST API, beside TF Serving's on the REST port.

Routes ``/v2`` paths: health, server and model metadata, readiness, ``infer`` with JSON
tensors and the binary tensor data extension (``Inference-Header-Content-Length``), and
the model repository extension. Errors answer ``{"error": "..."}`` with the status of
their canonical code (``errors.HTTP_STATUS``, the one mapping). The transport hands over
the method, path, body and the binary header's value; the answer is
``(status, headers, body)`` since binary outputs need their own headers.
"""
from __future__ import annotations

import logging
import re
import time
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
                 repository=None, executor=None):
        self.service = service
        self.executor = executor  # where the batching queue runs what it cannot on its own thread (RestApp.pool)
        self.extra_headers = extra_headers or []  # CORS, when the REST API sends it
        self.timeout_s = timeout_s
        self.repository = repository  # v2_repository.Repository, or None: the extension answers UNIMPLEMENTED

    @staticmethod
    def owns(path: str) -> bool:
        return path == "/v2" or path.startswith("/v2/")

    def cheap(self, path: str) -> bool:
        """Whether to answer on the event loop: health and server metadata (no model), and infer on a
        model that answers in microseconds (LiteRT, no batching), as TF Serving's REST path does."""
        if path in ("/v2", "/v2/health/live", "/v2/health/ready"):
            return True
        match = _MODEL.fullmatch(path)
        return match is not None and match.group(3) == "/infer" \
            and self.service.core.manager.runs_inline(unquote(match.group(1)))

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
        return status, _JSON + self.extra_headers, orjson.dumps(value)

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
        match = _MODEL.fullmatch(path)
        if match is not None:
            name, version, action = unquote(match.group(1)), match.group(2), match.group(3)
            version = unquote(version) if version else None
            if method == "GET" and action is None:
                return self._json(200, service.model_metadata(name, version))
            if method == "GET" and action == "/ready":
                if service.model_ready(name, version):
                    return self._json(200, {"name": name, "ready": True})
                raise ServingError(Code.UNAVAILABLE, f"model '{name}'"
                                   + (f" version {version}" if version else "") + " is not ready")
            if method == "POST" and action == "/infer":
                return self._infer(name, version, body, header_length)
        match = _REPOSITORY.fullmatch(path)
        if match is not None and method == "POST":
            if self.repository is None:
                raise ServingError(Code.UNIMPLEMENTED, "the model repository extension is not enabled")
            return self._repository(match, body)
        raise ServingError(Code.NOT_FOUND, f"no V2 route for {method} {path}")

    # ---- infer ------------------------------------------------------------------------------
    def _infer(self, name: str, version: str | None, body: bytes, header_length) -> tuple[int, list, bytes]:
        request, binary = split_body(body, header_length)
        inputs = decode_inputs(request, binary)
        requested, binary_outputs = requested_outputs(request)
        result = self.service.infer(name, version, inputs, requested, "REST")
        return self._infer_answer(request, result, binary_outputs)

    # ---- infer on a batching model: decoded on the event loop, answered from the queue ----------
    def submit(self, method: str, path: str, body: bytes, header_length: bytes | None):
        """Start an infer whose model batches, holding no thread while it waits in the queue (as
        ``RestApp.submit`` does for TF Serving's predicts, through the same ``queue_predict``).

        None when the request is not one, or is a JSON body too large to parse on the event loop
        (a binary body is sliced, not parsed: any size); ``(status, headers, body)`` when it is
        answered already; else a ``QueuedPredict`` to answer with ``finish_queued``."""
        if method != "POST" or (header_length is None and len(body) > LOOP_PARSE_MAX_BYTES):
            return None
        match = _MODEL.fullmatch(path)
        if match is None or match.group(3) != "/infer":
            return None
        name, version = unquote(match.group(1)), match.group(2)

        def read():
            request, binary = split_body(body, header_length)
            inputs = decode_inputs(request, binary)
            requested, binary_outputs = requested_outputs(request)
            return inputs, requested, lambda result: self._infer_answer(request, result, binary_outputs)

        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        try:
            return self.service.queue_infer(name, unquote(version) if version else None, read, "REST", deadline,
                                            self.executor)
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

    def _infer_answer(self, request: dict, result: InferResult, binary_outputs) -> tuple[int, list, bytes]:
        outputs, chunks = [], []
        for alias, array in result.outputs.items():
            tensor = {"name": alias, "datatype": v2_tensors.output_datatype(array), "shape": list(array.shape)}
            if binary_outputs(alias):
                raw = v2_tensors.to_raw(array)
                tensor["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
            else:
                tensor["data"] = v2_tensors.to_json_data(array)
            outputs.append(tensor)
        answer = {"model_name": result.model_name, "model_version": str(result.model_version), "outputs": outputs}
        if "id" in request:
            answer["id"] = request["id"]
        head = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
        if not chunks:
            return 200, _JSON + self.extra_headers, head
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
_WHITESPACE = b" \t\r\n"


def _data_arrays(body: bytes) -> list[tuple[int, int]]:
    """Where each ``"data": [...]`` array that holds no string or object lies in ``body``. Such an
    array ends at the last "]" before the next quote or brace; a wrong guess cannot parse (``_request``).
    Found with bytes.find, not a regular expression: that read every digit in Python's engine (24 µs)."""
    spans, at = [], 0
    while (at := body.find(b'"data"', at)) >= 0:
        at += 6
        colon = at
        while colon < len(body) and body[colon] in _WHITESPACE:
            colon += 1
        if colon >= len(body) or body[colon] != 58:  # ":": a key, not a string value "data"
            continue
        start = colon + 1
        while start < len(body) and body[start] in _WHITESPACE:
            start += 1
        if start >= len(body) or body[start] != 91:  # "["
            continue
        stop = min((i for i in (body.find(b'"', start), body.find(b"{", start), body.find(b"}", start)) if i >= 0),
                   default=len(body))
        close = body.rfind(b"]", start, stop)
        if close > start:
            spans.append((start, close + 1))
            at = close + 1
    return spans


def _request(body: bytes) -> dict:
    """The request object with each input's ``data`` array left as its text (``DataText``). The
    arrays are cut out and marked, the rest parsed; only when every mark is an input's ``data`` is
    that parse kept, else (a ``data`` key elsewhere, bad JSON) the body is parsed whole as sent."""
    spans = _data_arrays(body)
    if spans:
        pieces, texts, end = [], [], 0
        for i, (start, stop) in enumerate(spans):
            pieces += [body[end:start], b'{"\\u0000data":%d}' % i]
            texts.append(v2_tensors.DataText(body[start:stop]))
            end = stop
        pieces.append(body[end:])
        try:
            request = orjson.loads(b"".join(pieces))
        except orjson.JSONDecodeError:
            request = None
        if isinstance(request, dict) and _put_back(request, texts):
            return request
    return _json_object(body)


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
