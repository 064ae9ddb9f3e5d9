"""TF Serving's gRPC services (PredictionService, ModelService) over the core, with its status codes.

Requests and responses are the generated protos of ``tensorflow-serving-api``.
``Services`` holds the handlers and the one mapping of errors to gRPC statuses; both
gRPC servers call it: the lean HTTP/2 server (``grpc_h2``, the default) and grpcio's
(``add_services``, for ``--grpc_implementation=grpcio``).
"""
from __future__ import annotations

import logging
from typing import Callable, NamedTuple

import grpc
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    predict_pb2,
    regression_pb2,
)
from tensorflow_serving.apis import model_management_pb2

from modelyard.errors import Code, ServingError, invalid_argument
from modelyard.serving.batching.scheduler import set_request_timeout
from modelyard.serving.core import ModelSpec, QueuedPredict, ServingCore
from modelyard.model.signatures import CLASSIFY_METHOD, REGRESS_METHOD
from modelyard.serving.protocol import predict_response, v2_grpc
from modelyard.serving.protocol.v2_service import V2Service
from modelyard.serving.protocol.predict_response import fill_model_spec
from modelyard.model.tensor_proto import serialized_examples, to_ndarray

log = logging.getLogger("modelyard.serving")
_MESSAGE_LIMIT = 1024


class Method(NamedTuple):
    name: str
    request_class: type
    call: Callable  # request -> (response or None, Code, message)

    @staticmethod
    def response_serializer(response) -> bytes:
        """The wire bytes of a method's response: Predict's come encoded already (predict_response)."""
        return response if type(response) is bytes else response.SerializeToString()


_SERVICES: dict[str, dict[str, type]] = {
    "tensorflow.serving.PredictionService": {
        "Classify": classification_pb2.ClassificationRequest,
        "Regress": regression_pb2.RegressionRequest,
        "Predict": predict_pb2.PredictRequest,
        "MultiInference": inference_pb2.MultiInferenceRequest,
        "GetModelMetadata": get_model_metadata_pb2.GetModelMetadataRequest,
    },
    "tensorflow.serving.ModelService": {
        "GetModelStatus": get_model_status_pb2.GetModelStatusRequest,
        "HandleReloadConfigRequest": model_management_pb2.ReloadConfigRequest,
    },
}


def _truncated(message: str) -> str:
    return message[:_MESSAGE_LIMIT] + "...TRUNCATED" if len(message) > _MESSAGE_LIMIT else message


def _guard(api: str | None) -> Callable:
    """Run a handler, turning ServingErrors (and bugs) into (None, code, message); count the request.

    The one error mapping of both gRPC servers: a guarded method returns
    ``(response, Code.OK, "")`` or ``(None, code, message)`` and never raises.
    """

    def wrap(method):
        def handler(self, request):
            has_spec = "model_spec" in request.DESCRIPTOR.fields_by_name
            name = request.model_spec.name if has_spec else ""
            try:
                if has_spec and not request.HasField("model_spec"):
                    raise invalid_argument("Missing ModelSpec")
                if api is None:
                    return method(self, request), Code.OK, ""
                with self.core.request(name, api, "GRPC"):
                    return method(self, request), Code.OK, ""
            except Exception as exc:
                return (None, *status_of(exc, method.__name__))

        handler.__name__ = method.__name__
        return handler

    return wrap


def status_of(exc: Exception, what: str) -> tuple[Code, str]:
    """The gRPC status a failed call answers: a ServingError's own, else INTERNAL (logged: a bug)."""
    if isinstance(exc, ServingError):
        return exc.code, _truncated(exc.message)
    log.error("gRPC %s failed", what, exc_info=exc)
    return Code.INTERNAL, _truncated(f"{type(exc).__name__}: {exc}")


def _inputs_of(request) -> dict:
    """A request's input tensors as arrays, by alias (keys then lookups: the map's items() view is slower)."""
    tensors = request.inputs
    return {alias: to_ndarray(tensors[alias], alias) for alias in tensors}


def model_spec_of(proto) -> ModelSpec:
    which = proto.WhichOneof("version_choice")
    version = proto.version.value if which == "version" else None
    label = proto.version_label if which == "version_label" else None
    return ModelSpec(proto.name, version, label, proto.signature_name)


class Services:
    """Every unary method of PredictionService and ModelService, protocol-free.

    Each method takes a parsed request and returns ``(response or None, Code, message)``;
    ``methods`` maps the HTTP/2 path (``/package.Service/Method``) to the method and its
    request class, for both gRPC servers.
    """

    def __init__(self, core: ServingCore, reload_config: Callable, repository=None):
        self.core = core
        self.reload_config = reload_config
        self.methods: dict[str, Method] = {}
        for service, names in _SERVICES.items():
            for name, request_class in names.items():
                self.methods[f"/{service}/{name}"] = Method(name, request_class, getattr(self, name))
        # The Open Inference Protocol's GRPCInferenceService on the same server (v2_grpc.py).
        self.v2 = V2Service(core)
        for path, (name, request_class, call) in v2_grpc.methods(self.v2, repository).items():
            self.methods[path] = Method(name, request_class, call)

    @_guard("Predict")
    def Predict(self, request):
        spec = model_spec_of(request.model_spec)
        inputs = _inputs_of(request)
        with self.core.acquire(spec) as handle:
            sig, outputs = self.core.predict(handle, spec.signature_name, inputs, list(request.output_filter))
            version = handle.version
        return predict_response.encode(spec.name, version, sig.name, outputs)

    def start_predict(self, request, deadline: float | None, executor) -> "QueuedPredict | tuple | None":
        """Predict on a batching model without blocking a thread while the request is queued.

        None when ``request`` is not that (the caller runs ``Predict`` as usual, which
        answers every error in the same order); ``(None, code, message)`` when it fails
        before the queue; else a ``QueuedPredict`` to answer with ``finish_queued`` once its
        future completes. Same checks, errors, metrics and answers as ``Predict``.
        """
        if not request.HasField("model_spec"):
            return None
        spec = model_spec_of(request.model_spec)

        def encode(queued: QueuedPredict, outputs) -> bytes:
            return predict_response.encode(spec.name, queued.version, queued.signature_name, outputs)

        def read_request(_handle):
            inputs = _inputs_of(request)
            return spec.signature_name, inputs, encode

        try:
            return self.core.queue_predict(spec, "Predict", "GRPC", read_request, list(request.output_filter),
                                           deadline, executor)
        except Exception as exc:
            return (None, *status_of(exc, "Predict"))

    def start_infer(self, request, deadline: float | None, executor) -> "QueuedPredict | tuple | None":
        """V2's ModelInfer on a batching model, as ``start_predict`` (``v2_grpc.start_infer``);
        answered with ``finish_queued`` too."""
        return v2_grpc.start_infer(self.v2, request, deadline, executor)

    @staticmethod
    def finish_queued(queued: QueuedPredict) -> tuple[bytes | None, Code, str]:
        """``(serialized response or None, Code, message)`` for a started predict (call exactly once)."""
        try:
            return queued.finish(), Code.OK, ""
        except Exception as exc:
            return (None, *status_of(exc, "Predict"))

    @_guard("Classify")
    def Classify(self, request):
        return self._on_examples(request, self.core.classify, classification_pb2.ClassificationResponse,
                                 fill_classifications)

    @_guard("Regress")
    def Regress(self, request):
        return self._on_examples(request, self.core.regress, regression_pb2.RegressionResponse, fill_regressions)

    def _on_examples(self, request, run: Callable, response_class: type, fill: Callable):
        """Classify or Regress: run on the request's tf.Examples, answer with ``fill``-ed results."""
        spec = model_spec_of(request.model_spec)
        examples = serialized_examples(request.input)
        with self.core.acquire(spec) as handle:
            sig, result = run(handle, spec.signature_name, examples)
            response = response_class()
            fill_model_spec(response.model_spec, spec.name, handle.version, sig.name)
        fill(response.result, result, len(examples))
        return response

    @_guard(None)
    def MultiInference(self, request):
        examples = serialized_examples(request.input)
        if not request.tasks:
            raise invalid_argument("Inference request should have at least one task")
        names = {t.model_spec.name for t in request.tasks}
        if len(names) != 1:
            raise invalid_argument("All ModelSpecs in a MultiInferenceRequest must access the same model name.")
        response = inference_pb2.MultiInferenceResponse()
        first = model_spec_of(request.tasks[0].model_spec)
        with self.core.request(first.name, "MultiInference", "GRPC"), self.core.acquire(first) as handle:
            for task in request.tasks:
                spec = model_spec_of(task.model_spec)
                result = response.results.add()
                if task.method_name == CLASSIFY_METHOD:
                    sig, classes = self.core.classify(handle, spec.signature_name, examples)
                    fill_classifications(result.classification_result, classes, len(examples))
                elif task.method_name == REGRESS_METHOD:
                    sig, values = self.core.regress(handle, spec.signature_name, examples)
                    fill_regressions(result.regression_result, values, len(examples))
                else:
                    raise invalid_argument(f"Unsupported signature method_name: {task.method_name}")
                fill_model_spec(result.model_spec, spec.name, handle.version, sig.name)
        return response

    @_guard(None)
    def GetModelMetadata(self, request):
        if not request.metadata_field:
            raise invalid_argument("GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != "signature_def":
                raise invalid_argument(f"Metadata field {field} is not supported")
        spec = model_spec_of(request.model_spec)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        version, sig_map = self.core.signature_defs(spec)
        fill_model_spec(response.model_spec, spec.name, version, None)
        response.metadata["signature_def"].Pack(sig_map)
        return response

    @_guard(None)
    def GetModelStatus(self, request):
        spec = model_spec_of(request.model_spec)
        response = get_model_status_pb2.GetModelStatusResponse()
        State = get_model_status_pb2.ModelVersionStatus.State
        for status in self.core.status(spec.name, spec.version):
            entry = response.model_version_status.add(version=status.version, state=State.Value(status.state))
            entry.status.error_code = Code[status.error_code].value
            entry.status.error_message = status.error_message
        return response

    def HandleReloadConfigRequest(self, request):
        response = model_management_pb2.ReloadConfigResponse()
        try:
            if not request.config.HasField("model_config_list"):
                raise invalid_argument(
                    "ServerModelConfig type not supported by HandleReloadConfigRequest. Only ModelConfigList "
                    "is currently supported"
                )
            self.reload_config(request.config)
        except ServingError as exc:
            log.error("ReloadConfig failed: %s", exc.message)
            response.status.error_code = exc.code.value
            response.status.error_message = exc.message
            # TF Serving answers with both the response (carrying the status) and the gRPC error.
            return response, exc.code, _truncated(exc.message)
        except Exception as exc:
            log.exception("gRPC HandleReloadConfigRequest failed")
            return None, Code.INTERNAL, _truncated(f"{type(exc).__name__}: {exc}")
        response.status.error_code = 0
        return response, Code.OK, ""


def fill_classifications(target, result, batch: int) -> None:
    classes, scores = result.classes, result.scores
    for i in range(batch):
        row = target.classifications.add()
        n = (scores if scores is not None else classes).shape[1]
        for j in range(n):
            cls = row.classes.add()
            if classes is not None:
                label = classes[i, j]
                cls.label = label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
            if scores is not None:
                cls.score = float(scores[i, j])


def _grpcio_handler(method: Method) -> Callable:
    def handler(request, context):
        set_request_timeout(context.time_remaining())  # the client's deadline, for batching
        response, code, message = method.call(request)
        if code != Code.OK:
            if response is None:
                context.abort(grpc.StatusCode[code.name], message)
            context.set_code(grpc.StatusCode[code.name])
            context.set_details(message)
        return response

    return handler


def add_services(server: grpc.Server, core: ServingCore, reload_config: Callable, repository=None) -> None:
    """Register the services on a grpcio server (the ``--grpc_implementation=grpcio`` path)."""
    services = Services(core, reload_config, repository)
    by_service: dict[str, dict] = {}
    for path, method in services.methods.items():
        service = path.split("/")[1]
        by_service.setdefault(service, {})[method.name] = grpc.unary_unary_rpc_method_handler(
            _grpcio_handler(method),
            request_deserializer=method.request_class.FromString,
            response_serializer=method.response_serializer,
        )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(service, handlers) for service, handlers in by_service.items()]
    )


def fill_regressions(target, values, _count: int) -> None:
    for value in values.tolist():
        target.regressions.add(value=value)
