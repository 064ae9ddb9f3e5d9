"""A SavedModel whose LiteRT conversion is cached is served without importing TensorFlow.

``modelyard serve`` defers TensorFlow's import (``modelyard._deferred_tf``: its message types
load, its runtime does not) and loads such a version from the cache alone
(``choose_runtime.cached_servable``). The first start converts and verifies, as always; the
second start answers REST, gRPC and metadata exactly as the first did with no TensorFlow in the
process, and loads it only for a request LiteRT refuses, whose answer is TensorFlow's error.
"""
from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import requests

from tests.serving.server_process import ServerProcess

TF_LIBRARY = "_pywrap_tensorflow_internal"  # TensorFlow's runtime, mapped once it is imported


def _has_tensorflow(server: ServerProcess) -> bool:
    return TF_LIBRARY in Path(f"/proc/{server.proc.pid}/maps").read_text()


def _answers(server: ServerProcess, digits: np.ndarray) -> dict:
    import tensorflow as tf
    from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

    rest = requests.post(f"{server.base}/v1/models/digits:predict", json={"instances": digits.tolist()}, timeout=60)
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "digits"
        request.inputs["image"].CopyFrom(tf.make_tensor_proto(digits))
        predicted = stub.Predict(request, timeout=60)
        ask = get_model_metadata_pb2.GetModelMetadataRequest()
        ask.model_spec.name = "digits"
        ask.metadata_field.append("signature_def")
        metadata = get_model_metadata_pb2.SignatureDefMap()
        stub.GetModelMetadata(ask, timeout=60).metadata["signature_def"].Unpack(metadata)
    return {"rest": (rest.status_code, rest.json()),
            "grpc": tf.make_ndarray(predicted.outputs["probabilities"]).tolist(),
            "metadata": {name: sig.SerializeToString(deterministic=True) for name, sig in metadata.signature_def.items()},
            "rest_metadata": requests.get(f"{server.base}/v1/models/digits/metadata", timeout=60).json()}


def _refused(server: ServerProcess) -> tuple[int, dict]:
    r = requests.post(f"{server.base}/v1/models/digits:predict", json={"instances": [[1, 2, 3]]}, timeout=120)
    return r.status_code, r.json()


def _convert_here(version: Path, cache: Path, monkeypatch) -> None:
    """Fill ``cache`` as a first ``modelyard serve`` start would: convert, verify, keep."""
    from modelyard.model.runtime.choose_runtime import choose_runtime
    from modelyard.model.runtime.tf_session import load_saved_model

    monkeypatch.setenv("MODELYARD_CACHE", str(cache))
    servable = choose_runtime(load_saved_model(version), "auto")
    try:
        assert servable.runtime_of("serving_default") == "litert"
    finally:
        servable.close()


def test_a_cached_conversion_serves_without_tensorflow_until_litert_refuses(demo_cache, tmp_path, monkeypatch):
    from modelyard.demo import demo_instances, ensure_demo_model
    from modelyard.model.runtime.tf_session import load_saved_model

    base = ensure_demo_model(cache_dir=demo_cache, log=lambda _m: None)
    version = max(base.iterdir(), key=lambda p: int(p.name))
    _convert_here(version, tmp_path / "cache", monkeypatch)
    digits = demo_instances(3)
    session = load_saved_model(version)  # what TensorFlow answers, to compare with
    try:
        sig = session.signatures["serving_default"]
        expected = session.run(sig, {"image": digits}, ("probabilities",))["probabilities"]
        expected_defs = {name: d.SerializeToString(deterministic=True) for name, d in session.signature_def_map.items()}
    finally:
        session.close()

    server = ServerProcess("--model_name", "digits", "--model_base_path", str(base), log_dir=tmp_path,
                           env={"MODELYARD_CACHE": str(tmp_path / "cache")}, warm=False).wait_ready()
    try:
        assert not _has_tensorflow(server), server.log()[-3000:]
        answers = _answers(server, digits)
        assert not _has_tensorflow(server)  # both APIs and metadata needed only TensorFlow's messages
        np.testing.assert_allclose(answers["grpc"], expected, rtol=1e-5, atol=1e-6)
        assert answers["rest"][0] == 200
        np.testing.assert_allclose(answers["rest"][1]["predictions"], expected, rtol=1e-5, atol=1e-6)
        assert answers["metadata"] == expected_defs
        assert answers["rest_metadata"]["model_spec"] == {"name": "digits", "signature_name": "", "version": str(int(version.name))}
        status, error = _refused(server)  # refused by LiteRT, then TensorFlow, loaded for it: the shape rule's words
        assert status == 400 and error["error"].startswith("input 'image' has shape [1, 3]; the model expects "), error
        assert _has_tensorflow(server)
        assert _answers(server, digits) == answers  # and LiteRT still answers the rest
    finally:
        server.stop()
    assert "as checked at its first conversion (cached)" in server.log()
