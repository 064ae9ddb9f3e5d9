"""Predict, classify and regress on one servable: signature checks, input checks, result shaping.

Pure functions with no I/O and no protocol: the core service and model warmup call them,
and the REST and gRPC adapters only translate to and from them. Messages follow TF Serving.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelyard.errors import Code, ServingError, invalid_argument
from modelyard.model import dtypes
from modelyard.model.runtime.servable import Servable
from modelyard.model.signatures import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    PREDICT_METHOD,
    REGRESS_METHOD,
    Signature,
)


def predict_signature(servable: Servable, name: str) -> Signature:
    """The signature a predict request names ('' means serving_default)."""
    sig = servable.signatures.get(name or DEFAULT_SIGNATURE)
    if sig is None:
        raise ServingError(Code.FAILED_PRECONDITION, f'Serving signature key "{name or DEFAULT_SIGNATURE}" not found.')
    if sig.method_name not in (PREDICT_METHOD, CLASSIFY_METHOD, REGRESS_METHOD):
        raise ServingError(
            Code.INTERNAL,
            f"Expected prediction signature method_name to be one of {{{PREDICT_METHOD}, {CLASSIFY_METHOD}, "
            f"{REGRESS_METHOD}}}. Was: {sig.method_name}",
        )
    return sig


def output_aliases(sig: Signature, output_filter) -> tuple[str, ...]:
    if not output_filter:
        return tuple(sig.outputs)
    seen: set[str] = set()
    for alias in output_filter:
        if alias not in sig.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {alias} Outputs expected to be in the set "
                f"{{{','.join(sorted(sig.outputs))}}}."
            )
        if alias in seen:
            raise invalid_argument(f"duplicate output tensor alias: {alias}")
        seen.add(alias)
    return tuple(output_filter)


def check_inputs(sig: Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Match request inputs to the signature; fill TF2 defaults; refuse wrong aliases and dtypes."""
    if sig.defaults and set(inputs) != set(sig.inputs):
        inputs = {**{k: v for k, v in sig.defaults.items() if k in sig.inputs}, **inputs}
    if set(inputs) != set(sig.inputs):
        sent, wanted = set(inputs), set(sig.inputs)
        if len(sent) == len(wanted):
            alias = sorted(sent - wanted)[0]
            raise invalid_argument(
                f"input tensor alias not found in signature: {alias}. Inputs expected to be in the set "
                f"{{{','.join(sorted(wanted))}}}."
            )
        raise invalid_argument(
            f"input size does not match signature: {len(sent)}!={len(wanted)} len({{{','.join(sorted(sent))}}}) "
            f"!= len({{{','.join(sorted(wanted))}}}). Sent extra: {{{','.join(sorted(sent - wanted))}}}. "
            f"Missing but required: {{{','.join(sorted(wanted - sent))}}}."
        )
    for alias, value in inputs.items():
        spec = sig.inputs[alias]
        expected = spec.numpy_dtype
        if value.dtype != expected and not (expected.kind == "O" and value.dtype.kind in "OSU"):
            raise invalid_argument(
                f"Expects arg[{alias}] to be {dtypes.dtype_name(spec.dtype)[3:].lower()} but "
                f"{dtypes.dtype_name(dtypes.from_numpy(value.dtype))[3:].lower()} is provided"
                + dtypes.sending_hint(spec.dtype)
            )
    return inputs


def shape_failure(sig: Signature, inputs: dict[str, np.ndarray], exc: ServingError) -> ServingError:
    """The error to answer for a model call that failed with ``exc``: the signature's shape rule and message
    (``TensorSpec.shape_mismatch``, V2's) when an input's shape is what the signature refuses, else ``exc``.

    Checked only once the model refused: TF Serving feeds a TF1 session whatever shape the model takes
    (half_plus_two's ``[-1, 1]`` input answers ``[2.0, 3.0]``), so a shape is never refused up front over
    its APIs; but where the model does refuse it, the answer names the shapes, not TensorFlow's internals
    (``Input to reshape is a tensor with 3 values ... [[{{function_node __inference__wrapped_model_...``).
    """
    if exc.code != Code.INVALID_ARGUMENT:
        return exc
    for alias, value in inputs.items():
        mismatch = sig.inputs[alias].shape_mismatch(value.shape) if alias in sig.inputs else None
        if mismatch is not None:
            return invalid_argument(mismatch)
    return exc


def prepare_predict(servable: Servable, signature_name: str, inputs, output_filter=None):
    """Every check of a predict request before the model runs: ``(signature, inputs, output aliases)``.

    Shared by ``run_predict`` (blocking) and the core's ``queue_predict`` (batching queue).
    """
    sig = predict_signature(servable, signature_name)
    inputs = check_inputs(sig, inputs)
    return sig, inputs, output_aliases(sig, output_filter)


def run_predict(servable: Servable, signature_name: str, inputs, output_filter=None):
    """Returns ``(signature, {alias: array})`` in the order the outputs were asked for."""
    sig, inputs, aliases = prepare_predict(servable, signature_name, inputs, output_filter)
    try:
        return sig, servable.run(sig, inputs, aliases)
    except ServingError as exc:
        raise shape_failure(sig, inputs, exc) from None


# ---- classify and regress: serialized tf.Examples in, TF Serving's result shapes out ------------
def _example_signature(servable: Servable, name: str, method: str, kind: str) -> Signature:
    sig = servable.signatures.get(name or DEFAULT_SIGNATURE)
    if sig is None:
        raise invalid_argument(f"No signature was found with the name: {name or DEFAULT_SIGNATURE}")
    if sig.method_name != method:
        raise invalid_argument(f"Expected {kind} signature method_name to be {method}. Was: {sig.method_name}")
    if len(sig.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    return sig


def _examples_tensor(serialized: list[bytes]) -> np.ndarray:
    if not serialized:
        raise invalid_argument("Input is empty.")
    arr = np.empty(len(serialized), dtype=object)
    arr[:] = serialized
    return arr


@dataclass
class Classifications:
    classes: np.ndarray | None  # [batch, n] bytes
    scores: np.ndarray | None  # [batch, n] float32


def run_classify(servable: Servable, signature_name: str, serialized: list[bytes]) -> tuple[Signature, Classifications]:
    sig = _example_signature(servable, signature_name, CLASSIFY_METHOD, "classification")
    wanted = tuple(a for a in ("classes", "scores") if a in sig.outputs)
    if not wanted:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            'Expected classification signature outputs to contain at least one of "classes" or "scores".',
        )
    batch = len(serialized)
    (alias,) = sig.inputs
    out = servable.run(sig, {alias: _examples_tensor(serialized)}, wanted)
    classes, scores = out.get("classes"), out.get("scores")
    for name, value, dtype in (("classes", classes, dtypes.DT_STRING), ("scores", scores, dtypes.DT_FLOAT)):
        if value is None:
            continue
        if value.ndim != 2:
            raise invalid_argument(f"Expected Tensor shape: [batch_size num_classes] but got {list(value.shape)}")
        if sig.outputs[name].dtype != dtype:
            raise invalid_argument(
                f"Expected {name} Tensor of {dtypes.dtype_name(dtype)}. Got: {dtypes.dtype_name(sig.outputs[name].dtype)}"
            )
        if value.shape[0] != batch:
            raise invalid_argument(f"Expected {name} output batch size of {batch}. Got: {value.shape[0]}")
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise invalid_argument(
            f"Tensors class and score should match in dim_size(1). Got {classes.shape[1]} vs. {scores.shape[1]}"
        )
    return sig, Classifications(classes, scores)


def run_regress(servable: Servable, signature_name: str, serialized: list[bytes]) -> tuple[Signature, np.ndarray]:
    sig = _example_signature(servable, signature_name, REGRESS_METHOD, "regression")
    if "outputs" not in sig.outputs:
        raise ServingError(Code.FAILED_PRECONDITION, "No regression outputs found in SignatureDef.")
    (alias,) = sig.inputs
    values = servable.run(sig, {alias: _examples_tensor(serialized)}, ("outputs",))["outputs"]
    if not (values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)):
        raise invalid_argument(
            f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got {list(values.shape)}"
        )
    if values.shape[0] != len(serialized):
        raise invalid_argument(
            f"Input batch size did not match output batch size: {len(serialized)} vs. {values.shape[0]}"
        )
    return sig, values.reshape(-1).astype(np.float32, copy=False)


def merge_context(examples: list[bytes], context: bytes | None) -> list[bytes]:
    """Serialized context + example bytes parse as their merge (TF Serving's ExampleListWithContext)."""
    return examples if not context else [context + e for e in examples]
