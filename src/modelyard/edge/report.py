"""What a conversion cost: file size, LiteRT latency, and agreement with the original.

Agreement is measured on held-out data: accuracy when it is labelled (and the drop
in percentage points from the original's accuracy), top-1 agreement and the largest
absolute output difference always.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from modelyard.edge.data import Dataset
from modelyard.edge.runtime import LiteModel

LATENCY_RUNS = 200


@dataclass
class Reference:
    """The original model's outputs on the evaluation data."""

    outputs: dict[str, np.ndarray]
    data: Dataset

    @property
    def accuracy(self) -> float | None:
        return _accuracy(self.outputs, self.data)


@dataclass
class ModeReport:
    mode: str
    io_dtype: str
    size_bytes: int
    size_pct_of_float: float | None
    latency_us: float
    accuracy: float | None  # of the converted model, 0..1
    original_accuracy: float | None
    accuracy_drop_points: float | None  # percentage points lost vs the original
    top1_agreement: float | None
    max_abs_diff: float
    eval_data: str
    eval_samples: int


def _primary(outputs: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(outputs[sorted(outputs)[0]], dtype=np.float64)


def _accuracy(outputs: dict[str, np.ndarray], data: Dataset) -> float | None:
    scores = _primary(outputs)
    if data.labels is None or scores.ndim < 2 or scores.shape[-1] < 2:
        return None
    return float(np.mean(scores.argmax(-1) == data.labels))


def measure(
    content: bytes,
    reference: Reference,
    mode: str,
    io_dtype: str = "float32",
    float_size: int | None = None,
    input_order: list[str] | None = None,
    output_order: list[str] | None = None,
    latency_runs: int = LATENCY_RUNS,
) -> ModeReport:
    """Run ``content`` in LiteRT on the reference data and compare it with the original."""
    lite = LiteModel(content, input_order, output_order)
    got = lite.predict(reference.data.inputs)
    want, have = _primary(reference.outputs), _primary(got)
    top1 = float(np.mean(want.argmax(-1) == have.argmax(-1))) if want.ndim >= 2 and want.shape[-1] > 1 else None
    accuracy, original = _accuracy(got, reference.data), reference.accuracy
    return ModeReport(
        mode=mode,
        io_dtype=io_dtype,
        size_bytes=len(content),
        size_pct_of_float=round(100.0 * len(content) / float_size, 1) if float_size else None,
        latency_us=round(lite.median_latency_us(reference.data.inputs, runs=latency_runs), 1),
        accuracy=accuracy,
        original_accuracy=original,
        accuracy_drop_points=round(100.0 * (original - accuracy), 2) if accuracy is not None and original is not None else None,
        top1_agreement=top1,
        max_abs_diff=float(np.max(np.abs(want.reshape(have.shape) - have))),
        eval_data=reference.data.name,
        eval_samples=len(reference.data),
    )


def _fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def format_table(reports: list[ModeReport]) -> str:
    """A plain-text table, one row per conversion."""
    header = ("mode", "io", "size", "% float", "latency µs", "accuracy", "drop pts", "top-1 agree", "max |diff|")
    rows = [
        (
            r.mode,
            r.io_dtype,
            f"{r.size_bytes / 1024:.1f} KiB",
            _fmt(r.size_pct_of_float, "{:.1f}%"),
            f"{r.latency_us:.1f}",
            _fmt(r.accuracy, "{:.4f}"),
            _fmt(r.accuracy_drop_points, "{:+.2f}"),
            _fmt(r.top1_agreement, "{:.4f}"),
            f"{r.max_abs_diff:.2e}",
        )
        for r in reports
    ]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if reports:
        first = reports[0]
        original = _fmt(first.original_accuracy, "{:.4f}")
        lines.append(f"(eval: {first.eval_data}, {first.eval_samples} samples; original accuracy {original}; "
                     "latency: median of batch-1 LiteRT invokes)")
    return "\n".join(lines)


def to_json(reports: list[ModeReport]) -> str:
    return json.dumps([asdict(r) for r in reports], indent=2)
