"""Stock clients against the test servers: requests for REST, grpc + tensorflow-serving-api for gRPC."""
from __future__ import annotations

import grpc
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)



def channel(server, *, client_pems=None, ca=True) -> grpc.Channel:
    """A channel to ``server``'s gRPC port: TLS when it serves TLS (with a client certificate if given)."""
    if server.pki is None:
        return grpc.insecure_channel(server.grpc_target)
    key, cert = client_pems if client_pems else (None, None)
    credentials = grpc.ssl_channel_credentials(server.pki.ca_pem.encode() if ca else None, key, cert)
    return grpc.secure_channel(server.grpc_target, credentials)


def metadata(token: str | None) -> list:
    return [("authorization", f"Bearer {token}")] if token else []


def predict_request(values=(1.0, 2.0)) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    tensor = request.inputs["x"]
    tensor.dtype = 1  # DT_FLOAT
    tensor.tensor_shape.dim.add(size=len(values))
    tensor.float_val.extend(values)
    return request


def predict(chan: grpc.Channel, token: str | None = None, request=None) -> list[float]:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(chan)
    response = stub.Predict(request or predict_request(), metadata=metadata(token), timeout=10)
    return list(response.outputs["y"].float_val)


def metadata_call(chan: grpc.Channel, token: str | None = None):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "default"
    return prediction_service_pb2_grpc.PredictionServiceStub(chan).GetModelMetadata(
        request, metadata=metadata(token), timeout=10)


def status_call(chan: grpc.Channel, token: str | None = None):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "default"
    return model_service_pb2_grpc.ModelServiceStub(chan).GetModelStatus(request, metadata=metadata(token), timeout=10)


def reload_call(chan: grpc.Channel, token: str | None, base_path) -> object:
    """Reload a one-model config (the one the server runs: an allowed call changes nothing)."""
    request = model_management_pb2.ReloadConfigRequest()
    entry = request.config.model_config_list.config.add()
    entry.name, entry.base_path, entry.model_platform = "default", str(base_path), "tensorflow"
    return model_service_pb2_grpc.ModelServiceStub(chan).HandleReloadConfigRequest(
        request, metadata=metadata(token), timeout=30)


def code_of(call) -> grpc.StatusCode:
    """The status code ``call()`` ends with (OK when it returns)."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK

