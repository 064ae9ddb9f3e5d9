"""The Open Inference Protocol's gRPC service (``inference.GRPCInferenceService``) over ``V2Service``.

Its messages are the stubs generated from the published ``grpc_service.proto`` that
``tritonclient`` ships (``tritonclient.grpc.service_pb2``); none are written here.
``methods(service)`` gives each unary method as ``(name, request class, call)`` by its
HTTP/2 path; ``grpc_api.Services`` registers them beside PredictionService, so both gRPC
servers (the lean one and grpcio's) serve them on the same port. A call returns
``(response or None, Code, message)``: a ServingError's own code, INTERNAL for a bug.
Tensors arrive as ``raw_input_contents`` or typed ``contents``; outputs always leave as
``raw_output_contents`` (what Triton answers, and the cheapest to encode).
"""
from __future__ import annotations

import functools
import logging
from typing import Callable

from modelyard.errors import Code, ServingError, invalid_argument
from modelyard.serving.protocol import v2_tensors
from modelyard.serving.protocol import protobuf_wire as wire
from modelyard.serving.protocol.v2_service import V2Service

log = logging.getLogger("modelyard.serving")

SERVICE = "inference.GRPCInferenceService"


def _pb2():
    """The generated messages, or None when ``tritonclient`` is not installed."""
    try:
        from tritonclient.grpc import service_pb2
    except ImportError:
        return None
    return service_pb2


def available() -> bool:
    return _pb2() is not None


def _guarded(call: Callable) -> Callable:
    def run(request):
        try:
            return call(request), Code.OK, ""
        except ServingError as exc:
            return None, exc.code, exc.message
        except Exception as exc:  # a bug: INTERNAL, logged, and the server keeps serving
            log.error("gRPC %s failed", call.__name__, exc_info=exc)
            return None, Code.INTERNAL, f"{type(exc).__name__}: {exc}"

    run.__name__ = call.__name__
    return run


def methods(service: V2Service, repository=None) -> dict[str, tuple[str, type, Callable]]:
    """``/inference.GRPCInferenceService/Method`` -> ``(Method, request class, call)``; empty without the stubs."""
    pb = _pb2()
    if pb is None:
        return _off_methods(repository is not None)

    def ServerLive(_request):
        return pb.ServerLiveResponse(live=service.live())

    def ServerReady(_request):
        return pb.ServerReadyResponse(ready=service.ready())

    def ModelReady(request):
        return pb.ModelReadyResponse(ready=service.model_ready(request.name, request.version))

    def ServerMetadata(_request):
        return pb.ServerMetadataResponse(**service.server_metadata())

    def ModelMetadata(request):
        meta = service.model_metadata(request.name, request.version)
        response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
        for key in ("inputs", "outputs"):
            for tensor in meta[key]:
                getattr(response, key).add(**tensor)
        return response

    def ModelInfer(request):
        outputs = request.outputs
        result = service.infer(request.model_name, request.model_version, _inputs(request),
                               [o.name for o in outputs] if outputs else None, "GRPC")
        return _infer_response(pb, request, result)

    calls: list[tuple[Callable, str]] = [
        (ServerLive, "ServerLiveRequest"), (ServerReady, "ServerReadyRequest"), (ModelReady, "ModelReadyRequest"),
        (ServerMetadata, "ServerMetadataRequest"), (ModelMetadata, "ModelMetadataRequest"),
        (ModelInfer, "ModelInferRequest"),
    ]
    if repository is not None:
        calls += _repository_calls(pb, repository)
    return {f"/{SERVICE}/{call.__name__}": (call.__name__, getattr(pb, request), _guarded(call))
            for call, request in calls}


_BASE_CALLS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")
_REPOSITORY_CALLS = ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
OFF_MESSAGE = ("the Open Inference Protocol's gRPC service needs tritonclient, which is not installed "
               "(pip install tritonclient); its REST API is on")


class _Unread:
    """The request of a call the server cannot read without tritonclient's messages: left unparsed."""

    model_name = None  # not a model call: the transports route it like any other

    @classmethod
    def FromString(cls, _data) -> "_Unread":
        return cls()


def _off_methods(with_repository: bool) -> dict[str, tuple[str, type, Callable]]:
    """Without tritonclient, each of the service's methods answers UNIMPLEMENTED saying what to install, and
    the server's log says so once, when a client first asks: a server nobody calls over V2 gRPC (most) says
    nothing of a package it never needs."""
    warned = []

    def off(_request):
        if not warned:
            warned.append(True)
            log.warning("%s: a client called it", OFF_MESSAGE)
        return None, Code.UNIMPLEMENTED, OFF_MESSAGE

    names = _BASE_CALLS + (_REPOSITORY_CALLS if with_repository else ())
    return {f"/{SERVICE}/{name}": (name, _Unread, off) for name in names}


def _infer_response(pb, request, result) -> bytes:
    """A serialized ModelInferResponse, the bytes ``SerializeToString`` gives for the same message
    (fields in number order): its head and each output's tensor message come from the generated
    message once per model version and per output name, datatype and shape; only the request's id
    and the outputs' raw contents are written per request."""
    parts = [_response_head(pb, result.model_name, result.model_version)]
    if request.id:
        parts.append(wire.length_delimited(_ID_FIELD, request.id.encode()))
    raws = []
    for alias, array in result.outputs.items():
        parts.append(_output_tensor(pb, alias, v2_tensors.output_datatype(array), array.shape))
        raw = v2_tensors.to_raw(array)
        raws += (_RAW_KEY, wire.varint(len(raw)), raw)
    return b"".join(parts + raws)


# ModelInferResponse's field numbers, from the published grpc_service.proto (checked against the
# generated descriptor by tests/serving/test_v2_units.py): id = 3, outputs = 5, raw_output_contents = 6.
_ID_FIELD, _OUTPUTS_FIELD = 3, 5
_RAW_KEY = wire.key(6, wire.LEN)


@functools.lru_cache(maxsize=256)
def _response_head(pb, model_name: str, version: int) -> bytes:
    return pb.ModelInferResponse(model_name=model_name, model_version=str(version)).SerializeToString()


@functools.lru_cache(maxsize=1024)
def _output_tensor(pb, alias: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    return wire.length_delimited(_OUTPUTS_FIELD, pb.ModelInferResponse.InferOutputTensor(
        name=alias, datatype=datatype, shape=shape).SerializeToString())


def start_infer(service: V2Service, request, deadline: float | None, executor):
    """ModelInfer on a batching model without blocking a thread while it is queued (as
    ``grpc_api.Services.start_predict`` for Predict, through the same ``queue_predict``).

    None when the model does not batch (call ModelInfer as usual); ``(None, code, message)`` when it
    fails before the queue; else a ``QueuedPredict`` whose ``finish()`` gives the serialized response."""
    pb = _pb2()
    if pb is None:  # the call answers UNIMPLEMENTED (_off_methods)
        return None

    def read():
        return (_inputs(request), [o.name for o in request.outputs] or None,
                lambda result: _infer_response(pb, request, result))

    try:
        return service.queue_infer(request.model_name, request.model_version, read, "GRPC", deadline, executor)
    except ServingError as exc:
        return None, exc.code, exc.message
    except Exception as exc:  # a bug: INTERNAL, logged, and the server keeps serving
        log.error("gRPC ModelInfer failed", exc_info=exc)
        return None, Code.INTERNAL, f"{type(exc).__name__}: {exc}"


def _inputs(request) -> list[v2_tensors.V2Tensor]:
    """A ModelInferRequest's tensors: all from raw_input_contents (one per input, in order) or all typed."""
    raw, inputs = request.raw_input_contents, request.inputs
    if raw and len(raw) != len(inputs):
        raise invalid_argument(
            f"raw_input_contents holds {len(raw)} tensors but the request has {len(inputs)} inputs")
    tensors = []
    for i, tensor in enumerate(inputs):
        if raw:
            if tensor.HasField("contents"):
                raise invalid_argument(f"input '{tensor.name}' has both contents and raw_input_contents")
            tensors.append(v2_tensors.from_raw(tensor.name, tensor.datatype, list(tensor.shape), raw[i]))
        else:
            tensors.append(v2_tensors.from_contents(tensor.name, tensor.datatype, list(tensor.shape),
                                                    tensor.contents))
    if not tensors:
        raise invalid_argument("the request has no inputs")
    return tensors


def _repository_calls(pb, repository) -> list[tuple[Callable, str]]:
    def RepositoryIndex(request):
        response = pb.RepositoryIndexResponse()
        for entry in repository.index(ready_only=request.ready):
            response.models.add(**entry)
        return response

    def RepositoryModelLoad(request):
        repository.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(request):
        repository.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    return [(RepositoryIndex, "RepositoryIndexRequest"), (RepositoryModelLoad, "RepositoryModelLoadRequest"),
            (RepositoryModelUnload, "RepositoryModelUnloadRequest")]
