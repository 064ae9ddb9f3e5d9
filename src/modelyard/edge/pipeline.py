"""One conversion end to end: resolve SRC, check data, convert, measure; and ``compare`` across modes.

Every check that can fail (source, signature, data shapes, option combinations)
runs before the converter does, and nothing is written here: callers write the
returned bytes only once everything succeeded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelyard.edge.converter import convert_saved_model
from modelyard.edge.data import Dataset, load_dataset, synthetic_dataset
from modelyard.edge.modes import MODES, ConvertOptions
from modelyard.edge.report import ModeReport, Reference, measure
from modelyard.edge.runtime import run_saved_model
from modelyard.edge.signature import DEFAULT_SIGNATURE, SignatureSpec, read_signature
from modelyard.edge.source import resolve_version_dir


@dataclass
class Conversion:
    content: bytes
    report: ModeReport | None


@dataclass
class Prepared:
    """A resolved source with its signature and data, ready to convert in any mode."""

    version_dir: Path
    signature: SignatureSpec
    representative: Dataset | None
    reference: Reference | None

    def convert(self, options: ConvertOptions) -> bytes:
        return convert_saved_model(self.version_dir, self.signature, options, self.representative)

    def measure(self, content: bytes, options: ConvertOptions, float_size: int | None = None) -> ModeReport:
        return measure(
            content, self.reference, options.quantize, options.io_dtype, float_size,
            input_order=list(self.signature.inputs), output_order=list(self.signature.outputs),
        )


def prepare(
    src: str,
    representative: str | None = None,
    eval_data: str | None = None,
    signature_name: str = DEFAULT_SIGNATURE,
    with_report: bool = True,
) -> Prepared:
    """Resolve ``src``, load and check data, and run the original on the evaluation set."""
    version_dir = resolve_version_dir(src)
    signature = read_signature(version_dir, signature_name)
    rep = load_dataset(representative, signature, split="train") if representative else None
    reference = None
    if with_report:
        if eval_data:
            data = load_dataset(eval_data, signature, split="test")
        elif representative == "digits":
            data = load_dataset("digits", signature, split="test")  # held out from calibration
        else:
            data = synthetic_dataset(signature)
        reference = Reference(run_saved_model(version_dir, signature, data.inputs), data)
    return Prepared(version_dir, signature, rep, reference)


def convert(prepared: Prepared, options: ConvertOptions) -> Conversion:
    content = prepared.convert(options)
    report = prepared.measure(content, options) if prepared.reference is not None else None
    return Conversion(content, report)


def compare(prepared: Prepared, io_dtype: str = "uint8", allow_tf_ops: bool = False) -> list[ModeReport]:
    """Convert in every mode (int8 only when representative data is there) and measure each."""
    reports: list[ModeReport] = []
    float_size = None
    for mode in MODES:
        if mode == "int8" and prepared.representative is None:
            continue
        options = ConvertOptions(mode, io_dtype if mode == "int8" else "float32", allow_tf_ops)
        content = prepared.convert(options)
        float_size = float_size or len(content)  # "none" runs first
        reports.append(prepared.measure(content, options, float_size))
    return reports
