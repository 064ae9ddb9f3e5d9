"""Which Open Inference Protocol (KServe V2) call a platform URL is, and how a V2 body is told apart.

V2 is served at the platform's root (``/v2/models/{name}/infer``, ``name`` a deployed model id or an
endpoint id) and under an endpoint (``/v1/projects/P/locations/L/endpoints/E/v2/...``, so a client
given that URL as its base, e.g. ``tritonclient.http.InferenceServerClient(url="host:port/v1/.../endpoints/E")``,
calls the endpoint). Parsing only: the gateway decides where a call goes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

import orjson

_UNDER_ENDPOINT = re.compile(rb"^/v1/projects/([^/]+)/locations/([^/]+)/endpoints/([0-9]{1,30})(/v2(?:/[^?]*)?)(\?.*)?$")
_ROOT = re.compile(rb"^(/v2(?:/[^?]*)?)(\?.*)?$")
_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?")

# What a call does: the platform's health and metadata, or one deployed model's readiness, metadata or infer.
LIVE, READY, SERVER, MODEL_METADATA, MODEL_READY, INFER = "live", "ready", "server", "model", "model_ready", "infer"


@dataclass(frozen=True)
class V2Call:
    kind: str | None  # None: no V2 route (answered NOT_FOUND in V2's format)
    path: str  # the /v2/... part
    parent: str | None = None  # projects/P/locations/L when under an endpoint
    endpoint_id: str | None = None
    name: str | None = None  # the model name of /v2/models/{name}
    version: str | None = None


def parse(url: bytes, method: bytes) -> V2Call | None:
    """The V2 call of ``url``, or None when ``url`` is no V2 path (another route of the platform)."""
    m = _UNDER_ENDPOINT.match(url)
    if m is not None:
        parent = f"projects/{m.group(1).decode()}/locations/{m.group(2).decode()}"
        endpoint_id, path = m.group(3).decode(), m.group(4).decode("utf-8", "replace")
    else:
        m = _ROOT.match(url)
        if m is None:
            return None
        parent = endpoint_id = None
        path = m.group(1).decode("utf-8", "replace")
    path = path.rstrip("/") or path
    if method == b"GET":
        kind = {"/v2/health/live": LIVE, "/v2/health/ready": READY, "/v2": SERVER}.get(path)
        if kind is not None:
            return V2Call(kind, path, parent, endpoint_id)
    model = _MODEL.fullmatch(path)
    if model is None:
        return V2Call(None, path, parent, endpoint_id)
    action = model.group(3)
    kind = {(b"GET", None): MODEL_METADATA, (b"GET", "/ready"): MODEL_READY, (b"POST", "/infer"): INFER}.get(
        (method, action))
    version = unquote(model.group(2)) if model.group(2) else None
    return V2Call(kind, path, parent, endpoint_id, unquote(model.group(1)), version)


def is_v2_body(body: bytes, header_length: bytes | None) -> bool:
    """Whether a ``:rawPredict`` body is a V2 infer request rather than TF Serving's ``instances``/``inputs``.

    The binary extension's header says so outright; else V2's ``inputs`` is a list of tensor objects
    with a ``datatype`` (TF Serving's ``inputs`` is a value or a map of values). The body is parsed only
    when it names ``datatype`` at all, so TF Serving bodies pass untouched."""
    if header_length is not None:
        return True
    if b'"datatype"' not in body:
        return False
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    return isinstance(inputs, list) and bool(inputs) and all(
        isinstance(t, dict) and "datatype" in t for t in inputs)
