"""Representative (calibration) and evaluation data, checked against the signature up front.

A dataset is a ``.npz`` file holding one array per signature input (keyed by the
input's name; a single-input model may use any one key) and optionally labels
under ``labels`` or ``y``; or ``digits``, the built-in digits data (train split
to calibrate and fine-tune, test split to evaluate) that the demo model was trained on.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from modelyard.model.tflite import ConvertError
from modelyard.model.signatures import Signature, TensorSpec

BUILTIN_DIGITS = "digits"
LABEL_KEYS = ("labels", "y")
# Calibration ranges settle after a few hundred samples; more only slows conversion.
MAX_CALIBRATION_SAMPLES = 300


@dataclass
class Dataset:
    name: str
    inputs: dict[str, np.ndarray]  # signature alias -> [n, ...]
    labels: np.ndarray | None

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    def take(self, n: int) -> "Dataset":
        return Dataset(
            self.name,
            {k: v[:n] for k, v in self.inputs.items()},
            None if self.labels is None else self.labels[:n],
        )


def _describe(array: np.ndarray) -> str:
    return f"{array.dtype.name} [{', '.join(str(d) for d in array.shape)}]"


def _check(spec: TensorSpec, array: np.ndarray, source: str) -> None:
    problem = None
    if array.dtype != spec.numpy_dtype:
        problem = "dtype"
    elif spec.shape is not None and (
        array.ndim != len(spec.shape)
        or any(want >= 0 and want != got for want, got in zip(spec.shape, array.shape))
    ):
        problem = "shape"
    if problem:
        raise ConvertError(
            f"{source}: input {spec.alias!r} is {_describe(array)} but the signature wants "
            f"{spec.describe().split(': ', 1)[1]} ({problem} mismatch; cast or reshape the data before saving it)"
        )


def _from_npz(path: Path, signature: Signature) -> Dataset:
    if not path.is_file():
        raise ConvertError(f"data file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{path} is not a readable .npz file: {exc}") from exc
    labels = next((arrays.pop(k) for k in LABEL_KEYS if k in arrays), None)
    wanted = list(signature.inputs)
    if all(alias in arrays for alias in wanted):
        inputs = {alias: arrays[alias] for alias in wanted}
    elif len(wanted) == 1 and len(arrays) == 1:
        inputs = {wanted[0]: next(iter(arrays.values()))}
    else:
        raise ConvertError(
            f"{path} holds arrays {sorted(arrays) or 'none'}; the signature's inputs are {wanted} "
            f"(save one array per input under its name, labels optionally under 'labels')"
        )
    return Dataset(str(path), inputs, labels)


def _digits(signature: Signature, split: str) -> Dataset:
    from modelyard.datasets import load_digits_28

    if len(signature.inputs) != 1:
        raise ConvertError("the built-in 'digits' data fits single-input models only")
    images, labels = load_digits_28(split)
    return Dataset(f"digits ({split} split)", {next(iter(signature.inputs)): images}, labels)


def load_dataset(source: str, signature: Signature, split: str = "train") -> Dataset:
    """Load ``source`` (a .npz path or ``digits``) and check it against ``signature``.

    Raises ConvertError naming the input, the data's dtype/shape and the signature's,
    so a mismatch is reported before any conversion starts.
    """
    data = _digits(signature, split) if source == BUILTIN_DIGITS else _from_npz(Path(source), signature)
    sizes = {len(a) for a in data.inputs.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ConvertError(f"{data.name}: inputs must be non-empty and have the same number of samples")
    for alias, array in data.inputs.items():
        _check(signature.inputs[alias], array, data.name)
    if data.labels is not None and len(data.labels) != len(data):
        raise ConvertError(f"{data.name}: {len(data.labels)} labels for {len(data)} samples")
    return data


def synthetic_dataset(signature: Signature, n: int = 64, seed: int = 0) -> Dataset:
    """Random inputs matching the signature, for agreement checks when no data is given."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for alias, spec in signature.inputs.items():
        dtype = spec.numpy_dtype
        if dtype.kind not in "iuf":
            raise ConvertError(
                f"input {spec.describe()}: cannot make random data for the report; pass --eval-data or --no-report"
            )
        if spec.shape is None or any(d < 0 for d in spec.shape[1:]):
            raise ConvertError(f"input {spec.describe()} has unknown dimensions; pass --eval-data")
        shape = (n,) + tuple(spec.shape[1:])
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            inputs[alias] = rng.integers(max(info.min, 0), min(info.max, 255), size=shape, endpoint=True).astype(dtype)
        elif dtype.kind == "f":
            inputs[alias] = rng.standard_normal(shape).astype(dtype)
        else:
            raise ConvertError(f"cannot synthesise data for input {spec.describe()}; pass --eval-data")
    return Dataset("synthetic random inputs", inputs, None)


def representative_batches(data: Dataset, order: list[str], as_dict: bool) -> Iterator:
    """Batch-1 samples for the converter's ``representative_dataset``."""
    for i in range(min(len(data), MAX_CALIBRATION_SAMPLES)):
        sample = {alias: data.inputs[alias][i : i + 1] for alias in order}
        yield sample if as_dict else [sample[alias] for alias in order]
