"""Warmup: TF Serving's assets.extra/tf_serving_warmup_requests replayed before a version serves."""
from __future__ import annotations

import json

import requests

import modelyard  # noqa: F401
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from tests.serving.affine_models import save_affine
from tests.serving.server_process import ServerProcess, wait_for


def write_warmup(version_dir, records: list[bytes]):
    extra = version_dir / "assets.extra"
    extra.mkdir(parents=True)
    with tf.io.TFRecordWriter(str(extra / "tf_serving_warmup_requests")) as writer:
        for record in records:
            writer.write(record)


def predict_log(x: float) -> bytes:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[x]], dtype=tf.float32))
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request)).SerializeToString()


def test_warmup_replayed_and_bad_warmup_fails_the_version(tmp_path):
    base = tmp_path / "m"
    good = save_affine(base / "1", 1.0, 1.0)
    write_warmup(good, [predict_log(1.0), predict_log(2.0)])
    monitoring = tmp_path / "monitoring.txt"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }\n')
    with ServerProcess("--model_name", "m", "--model_base_path", str(base), "--monitoring_config_file",
                       str(monitoring), log_dir=tmp_path) as server:
        metrics = requests.get(server.base + "/metrics").text
        assert ':tensorflow:serving:model_warmup_latency_count{model_path="' + str(good) + '",status="OK"} 1' in metrics
        assert "Number of warmup records read: 2" in server.log()
        # A version whose warmup request fails never takes traffic; version 1 keeps serving.
        bad = save_affine(tmp_path / "staging", 5.0, 0.0)
        request = predict_pb2.PredictRequest()
        request.inputs["wrong_alias"].CopyFrom(tf.make_tensor_proto([[1.0]], dtype=tf.float32))
        write_warmup(bad, [prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=request)).SerializeToString()])
        bad.rename(base / "2")

        def version_2_failed():
            statuses = requests.get(server.base + "/v1/models/m").json()["model_version_status"]
            return [s for s in statuses if s["version"] == "2" and s["state"] == "END"]

        (status,) = wait_for(version_2_failed, 60, what="version 2 to fail warmup")
        assert status["status"]["error_code"] == "INVALID_ARGUMENT"
        assert "input tensor alias not found in signature: wrong_alias" in status["status"]["error_message"]
        r = requests.post(server.base + "/v1/models/m:predict", data=json.dumps({"instances": [[1.0]]}))
        assert r.json() == {"predictions": [[2.0]]}
