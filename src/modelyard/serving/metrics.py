"""Prometheus metrics under TF Serving's names (``:tensorflow:serving:request_count`` ...).

A tiny registry instead of a client library: TF Serving's text format has no HELP
lines, which we reproduce. With several worker processes each one exports a snapshot
(``snapshot()``) and the one answering a scrape merges its peers' into its own.
"""
from __future__ import annotations

import bisect
import re
import threading


def _exp_buckets(scale: float, growth: float, count: int) -> list[float]:
    return [scale * growth**i for i in range(count)]


LATENCY_BUCKETS = _exp_buckets(10, 1.8, 33)  # microseconds, as TF Serving's samplers
QUEUING_BUCKETS = _exp_buckets(100, 1.2, 52)  # microseconds, as TF Serving's batching_session (~1 s)
BATCH_SIZE_BUCKETS = [float(2**i) for i in range(17)]  # rows: 1, 2, 4 ... 65536


def _prom_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", ":", name)


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [n + '="' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}"


class Counter:
    kind = "counter"

    def __init__(self, name: str, labels: tuple[str, ...]):
        self.name, self.label_names = _prom_name(name), labels
        self._values: dict[tuple, float] = {}
        self._lock = threading.Lock()

    def inc(self, *labels: str, by: float = 1) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0) + by

    def set(self, *labels: str, value: float) -> None:
        with self._lock:
            self._values[labels] = value

    def get(self, *labels: str) -> float:
        return self._values.get(labels, 0)

    def snapshot(self) -> dict[tuple, float]:
        with self._lock:
            return dict(self._values)

    @staticmethod
    def merge(into: dict, other: dict) -> None:
        for key, value in other.items():
            into[key] = into.get(key, 0) + value

    def lines(self, values: dict[tuple, float]) -> list[str]:
        return [f"{self.name}{_labels(self.label_names, k)} {_fmt(v)}" for k, v in sorted(values.items())]


class Gauge(Counter):
    kind = "gauge"

    @staticmethod
    def merge(into: dict, other: dict) -> None:  # every worker reports the same state
        for key, value in other.items():
            into[key] = max(into.get(key, value), value)


class Histogram:
    kind = "histogram"

    def __init__(self, name: str, labels: tuple[str, ...], buckets: list[float] = LATENCY_BUCKETS):
        self.name, self.label_names, self.buckets = _prom_name(name), labels, buckets
        self._values: dict[tuple, list] = {}  # labels -> [bucket counts..., sum, count]
        self._lock = threading.Lock()

    def observe(self, value: float, *labels: str) -> None:
        with self._lock:
            row = self._values.get(labels)
            if row is None:
                row = self._values[labels] = [0] * (len(self.buckets) + 3)
            row[bisect.bisect_left(self.buckets, value)] += 1
            row[-2] += value
            row[-1] += 1

    def snapshot(self) -> dict[tuple, list]:
        with self._lock:
            return {k: list(v) for k, v in self._values.items()}

    @staticmethod
    def merge(into: dict, other: dict) -> None:
        for key, row in other.items():
            mine = into.setdefault(key, [0] * len(row))
            for i, n in enumerate(row):
                mine[i] += n

    def lines(self, values: dict[tuple, list]) -> list[str]:
        out = []
        for key, row in sorted(values.items()):
            cumulative = 0
            for limit, n in zip(self.buckets + [float("inf")], row[:-2]):
                cumulative += n
                le_label = 'le="' + ("+Inf" if limit == float("inf") else _fmt(round(limit, 6))) + '"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, le_label)} {cumulative}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_fmt(row[-2])}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {row[-1]}")
        return out


class ServingMetrics:
    """Every metric the server exports."""

    def __init__(self):
        self.request_count = Counter("/tensorflow/serving/request_count", ("model_name", "status"))
        self.request_latency = Histogram("/tensorflow/serving/request_latency", ("model_name", "API", "entrypoint"))
        self.runtime_latency = Histogram("/tensorflow/serving/runtime_latency", ("model_name", "API", "runtime"))
        self.example_count_total = Counter("/tensorflow/serving/request_example_count_total", ("model",))
        self.warmup_latency = Histogram("/tensorflow/serving/model_warmup_latency", ("model_path", "status"))
        self.load_attempt_count = Counter("/tensorflow/cc/saved_model/load_attempt_count", ("model_path", "status"))
        self.load_latency = Counter("/tensorflow/cc/saved_model/load_latency", ("model_path",))
        # modelyard's own: which runtime serves each loaded version (1 while loaded).
        self.model_runtime = Gauge("/modelyard/serving/model_runtime", ("model_name", "version", "runtime"))
        # Batching (--enable_batching), under TF Serving's batching_session names; modelyard adds the
        # model_name label so that each model's batches can be told apart.
        self.queuing_latency = Histogram("/tensorflow/serving/batching_session/queuing_latency",
                                         ("thread_pool_name", "model_name"), QUEUING_BUCKETS)
        self.wrapped_run_count = Counter("/tensorflow/serving/batching_session/wrapped_run_count", ("model_name",))
        self.input_batch_size = Histogram("/tensorflow/serving/batching_session/input_batch_size",
                                          ("model_name",), BATCH_SIZE_BUCKETS)
        self.processed_batch_size = Histogram("/tensorflow/serving/batching_session/processed_batch_size",
                                              ("model_name",), BATCH_SIZE_BUCKETS)
        self._all = [
            self.load_attempt_count, self.load_latency, self.model_runtime, self.request_count,
            self.example_count_total, self.request_latency, self.runtime_latency, self.warmup_latency,
            self.queuing_latency, self.wrapped_run_count, self.input_batch_size, self.processed_batch_size,
        ]

    def batch_recorder(self, model_name: str, thread_pool_name: str) -> "BatchMetrics":
        """What one model's batching servable reports into (a ``scheduler.BatchRecorder``)."""
        return BatchMetrics(self, model_name, thread_pool_name)

    def snapshot(self) -> dict[str, list]:
        """This process's values, JSON-friendly: {metric name: [[labels...], value]}."""
        return {m.name: [[list(k), v] for k, v in m.snapshot().items()] for m in self._all}

    def render(self, peers: list[dict[str, list]] = ()) -> str:
        """Prometheus text of this process's values plus ``peers``' snapshots."""
        lines = []
        for metric in self._all:
            values = metric.snapshot()
            for peer in peers:
                metric.merge(values, {tuple(k): v for k, v in peer.get(metric.name, [])})
            body = metric.lines(values)
            if body:
                lines.append(f"# TYPE {metric.name} {metric.kind}")
                lines.extend(body)
        return "\n".join(lines) + "\n"


class BatchMetrics:
    """One model's batching figures: time in the queue, rows per batch before and after padding."""

    def __init__(self, metrics: ServingMetrics, model_name: str, thread_pool_name: str):
        self._metrics, self._model, self._pool = metrics, model_name, thread_pool_name

    def queued(self, seconds: float) -> None:
        self._metrics.queuing_latency.observe(seconds * 1e6, self._pool, self._model)

    def batch(self, rows: int, padded: int) -> None:
        self._metrics.wrapped_run_count.inc(self._model)
        self._metrics.input_batch_size.observe(rows, self._model)
        self._metrics.processed_batch_size.observe(padded, self._model)
