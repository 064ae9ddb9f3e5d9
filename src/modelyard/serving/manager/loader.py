"""Turn a version directory into a ready servable: pick the runtime, load, warm up, record metrics.

A directory with ``model.tflite`` runs on LiteRT; a SavedModel runs in a TensorFlow session; one
with ``model.joblib`` / ``model.pkl`` / ``model.bst`` (no SavedModel) is a scikit-learn or XGBoost
model (``model.runtime.estimators``).
Warmup replays ``assets.extra/tf_serving_warmup_requests`` before the version takes traffic.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from modelyard.errors import Code, ServingError
from modelyard.model.savedmodel import TFLITE_FILE, SavedModelError, saved_model_file
from modelyard.model.runtime import inference
from modelyard.serving.batching.scheduler import maybe_batch
from modelyard.serving.metrics import ServingMetrics
from modelyard.model.runtime.servable import Servable
from modelyard.model.tensor_proto import serialized_examples, to_ndarray

log = logging.getLogger("modelyard.serving")

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000


class VersionLoader:
    """Callable used by the Manager: ``loader(model_name, version, path) -> Servable``."""

    def __init__(
        self, metrics: ServingMetrics, session_config=None, warmup_iterations: int = 1, runtime: str = "auto",
        batching=None,
    ):
        self.metrics = metrics
        self.batching = batching  # a BatchingPolicy: wrap each version so warmup and requests batch
        self.runtime = runtime
        self.session_config = session_config
        self.warmup_iterations = warmup_iterations

    def __call__(self, model_name: str, version: int, path: Path) -> Servable:
        started = time.perf_counter()
        try:
            servable = self._load(path)
            if self.batching is not None:
                servable = self._batched(servable, model_name, version, path)
        except Exception:
            self.metrics.load_attempt_count.inc(str(path), "fail")
            raise
        self.metrics.load_attempt_count.inc(str(path), "success")
        self.metrics.load_latency.inc(str(path), by=int((time.perf_counter() - started) * 1e6))
        try:
            self._warmup(servable, path)
        except BaseException:
            servable.close()
            raise
        for runtime in runtimes_of(servable):
            self.metrics.model_runtime.set(model_name, str(version), runtime, value=1)
        return servable

    def _batched(self, servable: Servable, model_name: str, version: int, path: Path) -> Servable:
        """``servable`` behind a batching queue, saying in the log with which parameters."""
        servable = maybe_batch(servable, path, self.batching)
        params = servable.params
        servable.recorder = self.metrics.batch_recorder(model_name, params.thread_pool_name)
        log.info("Model %s version %d batches: max_batch_size %d, batch_timeout_micros %d, max_enqueued_batches %d, "
                 "num_batch_threads %d%s%s", model_name, version, params.max_batch_size, params.batch_timeout_micros,
                 params.max_enqueued_batches, params.num_batch_threads,
                 f", allowed_batch_sizes {list(params.allowed_batch_sizes)}" if params.allowed_batch_sizes else "",
                 ", pad_variable_length_inputs" if params.pad_variable_length_inputs else "")
        return servable

    def unloaded(self, model_name: str, version: int) -> None:
        """Called by the Manager once a version is closed: its runtime gauge drops to 0."""
        for labels in self.metrics.model_runtime.snapshot():
            if labels[:2] == (model_name, str(version)):
                self.metrics.model_runtime.set(*labels, value=0)

    def _load(self, path: Path) -> Servable:
        if (path / TFLITE_FILE).is_file():  # a flatbuffer runs on LiteRT whatever --runtime says
            from modelyard.model.runtime.litert import load_tflite

            return load_tflite(path, path / TFLITE_FILE)
        try:
            saved_model_file(path)
        except SavedModelError as exc:
            from modelyard.model.runtime import estimators

            if estimators.model_file(path) is not None:  # scikit-learn / XGBoost (Vertex's prebuilt images)
                return estimators.load_estimator(path)
            raise ServingError(Code.NOT_FOUND, str(exc)) from None
        from modelyard.model.runtime.choose_runtime import cached_servable

        cached = cached_servable(path, self.runtime, self.session_config)
        if cached is not None:  # no TensorFlow needed to start (its import costs more than the rest)
            return cached
        from modelyard.model.runtime.tf_session import load_saved_model

        import tensorflow as tf

        try:
            session = load_saved_model(path, self.session_config)
        except tf.errors.OpError as exc:
            raise ServingError(Code(exc.error_code), exc.message) from None
        from modelyard.model.runtime.choose_runtime import choose_runtime

        try:
            return choose_runtime(session, self.runtime)
        except BaseException:
            session.close()
            raise

    def _warmup(self, servable: Servable, path: Path) -> None:
        warmup_path = path / WARMUP_FILE
        if not warmup_path.is_file():
            return
        from tensorflow_serving.apis import prediction_log_pb2

        read, data_loss = _record_reader()
        started = time.perf_counter()
        count = 0
        try:
            for record in read(warmup_path):
                count += 1
                if count > MAX_WARMUP_RECORDS:
                    raise ServingError(
                        Code.INVALID_ARGUMENT,
                        f"Number of warmup records exceeds the maximum ({MAX_WARMUP_RECORDS}) at {warmup_path}",
                    )
                entry = prediction_log_pb2.PredictionLog()
                try:
                    entry.ParseFromString(record)
                except Exception:
                    raise ServingError(
                        Code.INVALID_ARGUMENT, f"Failed to parse warmup record from {warmup_path}"
                    ) from None
                for _ in range(self.warmup_iterations):
                    replay(servable, entry)
        except data_loss as exc:
            raise ServingError(
                Code.DATA_LOSS, f"{getattr(exc, 'message', exc)}. Please verify your warmup data is in TFRecord format."
            ) from None
        except ServingError as exc:
            self.metrics.warmup_latency.observe((time.perf_counter() - started) * 1e6, str(path), exc.code.name)
            raise
        self.metrics.warmup_latency.observe((time.perf_counter() - started) * 1e6, str(path), "OK")
        log.info(
            "Finished reading warmup data for model at %s. Number of warmup records read: %d.", warmup_path, count
        )


def _record_reader():
    """(records of a TFRecord file, the error a damaged one raises): TensorFlow's where it is installed,
    else the graph runtime's reader (the serving image without TensorFlow)."""
    from modelyard.model.runtime.choose_runtime import tensorflow_installed

    if tensorflow_installed():
        import tensorflow as tf

        return (lambda path: tf.data.TFRecordDataset(str(path)).as_numpy_iterator()), tf.errors.DataLossError
    from modelyard.model.graph.tfrecord import TFRecordError, records

    return records, TFRecordError


def runtimes_of(servable: Servable) -> list[str]:
    """Every runtime serving some signature of ``servable`` (LiteRT and TensorFlow when mixed)."""
    runtime_of = getattr(servable, "runtime_of", None)
    if runtime_of is None:
        return [servable.runtime]
    return sorted({runtime_of(name) for name in servable.signatures})


def replay(servable: Servable, entry) -> None:
    """Run one PredictionLog's request against ``servable`` (answers are discarded)."""
    kind = entry.WhichOneof("log_type")
    if kind == "predict_log":
        req = entry.predict_log.request
        inputs = {alias: to_ndarray(t, alias) for alias, t in req.inputs.items()}
        inference.run_predict(servable, req.model_spec.signature_name, inputs, list(req.output_filter))
    elif kind == "classify_log":
        req = entry.classify_log.request
        inference.run_classify(servable, req.model_spec.signature_name, serialized_examples(req.input))
    elif kind == "regress_log":
        req = entry.regress_log.request
        inference.run_regress(servable, req.model_spec.signature_name, serialized_examples(req.input))
    elif kind == "multi_inference_log":
        req = entry.multi_inference_log.request
        examples = serialized_examples(req.input)
        for task in req.tasks:
            if task.method_name == "tensorflow/serving/classify":
                inference.run_classify(servable, task.model_spec.signature_name, examples)
            else:
                inference.run_regress(servable, task.model_spec.signature_name, examples)
    elif kind == "session_run_log":
        raise ServingError(Code.UNIMPLEMENTED, f"Unsupported log_type for warmup: {kind}")
