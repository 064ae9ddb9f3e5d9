"""Prometheus metrics under TF Serving's names (``:tensorflow:serving:request_count`` ...).

A tiny registry instead of a client library: TF Serving's text format has no HELP
lines and writes ``name{} N`` for unlabelled counters, which we reproduce.
"""
from __future__ import annotations

import re
import threading


def _exp_buckets(scale: float, growth: float, count: int) -> list[float]:
    return [scale * growth**i for i in range(count)]


LATENCY_BUCKETS = _exp_buckets(10, 1.8, 33)  # microseconds, as TF Serving's samplers


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

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_fmt(v)}" for k, v in items]


class Gauge(Counter):
    kind = "gauge"


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
            i = 0
            while i < len(self.buckets) and value > self.buckets[i]:
                i += 1
            row[i] += 1
            row[-2] += value
            row[-1] += 1

    def lines(self) -> list[str]:
        out = []
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._values.items())
        for key, row in items:
            cumulative = 0
            for limit, n in zip(self.buckets + [float("inf")], row[:-2]):
                cumulative += n
                le = "+Inf" if limit == float("inf") else _fmt(round(limit, 6))
                le_label = 'le="' + le + '"'
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
        self._all = [
            self.load_attempt_count, self.load_latency, self.model_runtime, self.request_count,
            self.example_count_total, self.request_latency, self.runtime_latency, self.warmup_latency,
        ]

    def render(self) -> str:
        lines = []
        for metric in self._all:
            body = metric.lines()
            if body:
                lines.append(f"# TYPE {metric.name} {metric.kind}")
                lines.extend(body)
        return "\n".join(lines) + "\n"
