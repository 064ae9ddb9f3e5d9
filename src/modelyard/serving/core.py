"""The core service: model lookup, predict/classify/regress, metadata and status, with metrics.

Protocol-free. REST and gRPC build a ``ModelSpec`` and call the same methods, so both
answer with the same results and the same errors.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from modelyard.errors import Code, ServingError, invalid_argument, not_found
from modelyard.model.runtime import inference
from modelyard.serving.manager.manager import Handle, Manager
from modelyard.serving.metrics import ServingMetrics


class _Timed:
    """``ServingCore.request``: a plain class, cheaper per request than a generator context manager."""

    __slots__ = ("metrics", "model_name", "api", "entrypoint", "started")

    def __init__(self, metrics: ServingMetrics, model_name: str, api: str, entrypoint: str):
        self.metrics, self.model_name, self.api, self.entrypoint = metrics, model_name, api, entrypoint
        self.started = time.perf_counter()

    def __enter__(self) -> "_Timed":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        self.finish(exc if kind is not None else None, kind)
        return False

    def finish(self, exc: BaseException | None = None, kind: type | None = None) -> None:
        """Count the request (and time it when it succeeded): ``__exit__``, or by hand when it ends elsewhere."""
        metrics = self.metrics
        if kind is None and exc is not None:
            kind = type(exc)
        if kind is None:
            metrics.request_count.inc(self.model_name, "OK")
            metrics.request_latency.observe(
                (time.perf_counter() - self.started) * 1e6, self.model_name, self.api, self.entrypoint
            )
        elif issubclass(kind, ServingError):
            metrics.request_count.inc(self.model_name, exc.code.name)
        elif issubclass(kind, Exception):
            metrics.request_count.inc(self.model_name, Code.UNKNOWN.name)


class QueuedPredict:
    """A predict waiting in a batching queue (``ServingCore.queue_predict``).

    It holds the model version and the request's metrics until ``finish()``, which the
    protocol server calls exactly once after ``future`` completes (on a batch thread): it
    returns the encoded answer or raises the request's error, after counting the request
    and releasing the version. ``expire()`` answers a still-queued request
    DEADLINE_EXCEEDED at once, freeing its rows in the queue.
    """

    __slots__ = ("handle", "timed", "future", "signature_name", "encode", "core", "started", "explain")

    def __init__(self, handle: Handle, timed: _Timed, future, signature_name: str, encode: Callable,
                 core: "ServingCore", started: float, explain: Callable | None = None):
        self.handle, self.timed, self.future = handle, timed, future
        self.signature_name, self.encode = signature_name, encode
        self.core, self.started = core, started
        self.explain = explain  # the model's error -> the answer's (inference.shape_failure)

    @property
    def version(self) -> int:
        return self.handle.version

    def expire(self, error: BaseException | None = None) -> None:
        """Leave the queue now, answered with ``error`` (default DEADLINE_EXCEEDED)."""
        self.future.expire(error)

    def finish(self):
        try:
            try:
                try:
                    outputs = self.future.result(0)
                except ServingError as exc:
                    if self.explain is None:
                        raise
                    raise self.explain(exc) from None
                # Timed up to when the batch thread settled the answer, not to this later hand-back:
                # recorded here so the batch thread, the bottleneck under load, does not pay for it.
                self.core._runtime(self.handle, "Predict", self.started, self.future.settled_at)
                answer = self.encode(self, outputs)
            except BaseException as exc:
                self.timed.finish(exc)
                raise
            self.timed.finish()
            return answer
        finally:
            self.handle.__exit__(None, None, None)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    version: int | None = None
    label: str | None = None
    signature_name: str = ""


@dataclass
class VersionStatus:
    version: int
    state: str
    error_code: str
    error_message: str


class ServingCore:
    def __init__(self, manager: Manager, metrics: ServingMetrics):
        self.manager = manager
        self.metrics = metrics

    # ---- lookup ------------------------------------------------------------------------
    def acquire(self, spec: ModelSpec) -> Handle:
        if not spec.name:
            raise invalid_argument("ModelSpec has no name specified.")
        return self.manager.acquire(spec.name, spec.version, spec.label)

    def request(self, model_name: str, api: str, entrypoint: str) -> "_Timed":
        """Count and time one request under TF Serving's metric names (a context manager)."""
        return _Timed(self.metrics, model_name, api, entrypoint)

    # ---- inference ---------------------------------------------------------------------
    def predict(self, handle: Handle, signature_name: str, inputs, output_filter=None):
        started = time.perf_counter()
        sig, outputs = inference.run_predict(handle.servable, signature_name, inputs, output_filter)
        self._runtime(handle, "Predict", started)
        return sig, outputs

    def queue_predict(self, spec: "ModelSpec", api: str, entrypoint: str, read_request: Callable[[Handle], tuple],
                      output_filter=None, deadline: float | None = None, executor=None) -> "QueuedPredict | None":
        """Start a predict on a batching model without blocking: it waits in the queue, holding no thread.

        None when ``spec``'s model does not batch (or cannot be found): the caller runs the
        blocking path, which answers every error in its usual order. ``read_request(handle)``
        returns ``(signature_name, inputs, encode)``, ``encode(queued, outputs)`` making the
        protocol's answer, or ``(signature_name, inputs, encode, output_filter)`` when the body
        it reads names the outputs (V2's ``outputs``), replacing ``output_filter``. Its errors,
        and ``predict``'s checks, are counted under ``api``/``entrypoint`` and raised here, at once.
        """
        try:
            handle = self.acquire(spec)
        except Exception:
            return None
        if getattr(handle.servable, "submit", None) is None:
            handle.__exit__(None, None, None)
            return None
        timed = self.request(spec.name, api, entrypoint)
        try:
            started = time.perf_counter()
            read = read_request(handle)
            signature_name, inputs, encode = read[:3]
            if len(read) == 4:
                output_filter = read[3]
            sig, inputs, aliases = inference.prepare_predict(handle.servable, signature_name, inputs, output_filter)
            future = handle.servable.submit(sig, inputs, aliases, deadline, executor)
        except BaseException as exc:
            handle.__exit__(None, None, None)
            timed.finish(exc)
            raise

        return QueuedPredict(handle, timed, future, sig.name, encode, self, started,
                             lambda exc: inference.shape_failure(sig, inputs, exc))

    def classify(self, handle: Handle, signature_name: str, serialized: list[bytes]):
        return self._on_examples(handle, "Classify", inference.run_classify, signature_name, serialized)

    def regress(self, handle: Handle, signature_name: str, serialized: list[bytes]):
        return self._on_examples(handle, "Regress", inference.run_regress, signature_name, serialized)

    def _on_examples(self, handle: Handle, api: str, run, signature_name: str, serialized: list[bytes]):
        started = time.perf_counter()
        result = run(handle.servable, signature_name, serialized)
        self._runtime(handle, api, started)
        self.metrics.example_count_total.inc(handle.model_name, by=len(serialized))
        return result

    def _runtime(self, handle: Handle, api: str, started: float, ended: float | None = None) -> None:
        self.metrics.runtime_latency.observe(
            ((ended or time.perf_counter()) - started) * 1e6, handle.model_name, api, handle.servable.runtime
        )

    # ---- metadata and status -----------------------------------------------------------
    def signature_defs(self, spec: ModelSpec):
        """The version ``spec`` resolves to and its ``SignatureDefMap``: the metadata both protocols answer."""
        from tensorflow_serving.apis import get_model_metadata_pb2

        with self.acquire(spec) as handle:
            sig_map = get_model_metadata_pb2.SignatureDefMap()
            for name, sig_def in handle.servable.signature_def_map.items():
                sig_map.signature_def[name].CopyFrom(sig_def)
            return handle.version, sig_map

    def list_models(self) -> list[tuple[str, dict[str, int], list[VersionStatus]]]:
        """Every configured model with its version labels and each version's state (GET /v1/models).

        TF Serving has no such call; a model with no version on disk yet is listed with none.
        """
        listed = []
        for name in sorted(self.manager.model_names()):
            config = self.manager.config_of(name)
            statuses = self.status(name) if self.manager.version_states(name) else []
            listed.append((name, dict(config.labels) if config else {}, statuses))
        return listed

    def status(self, name: str, version: int | None = None) -> list[VersionStatus]:
        if not name:
            raise invalid_argument("Missing model name in request.")
        records = self.manager.version_states(name)
        if version is not None:
            records = [r for r in records if r.version == version]
            if not records:
                raise not_found(f"Could not find version {version} of model {name}")
        elif not records and self.manager.on_demand is not None and self.manager.config_of(name) is not None:
            return []  # configured, loaded on its first request
        elif not records:
            raise not_found(f"Could not find any versions of model {name}{self.manager.unknown_model_hint(name)}")
        return [
            VersionStatus(
                r.version,
                r.state,
                r.error.code.name if r.error else "OK",
                r.error.message if r.error else "",
            )
            for r in records
        ]

