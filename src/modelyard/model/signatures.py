"""The one signature type: what a model version exposes, with typed, named inputs and outputs.

Every capability (server, converter, batch jobs) reads signatures through here; dtypes are
TensorFlow ``DataType`` enum values (``model.dtypes`` maps them), unknown dimensions are -1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelyard.model import dtypes
from modelyard.model.savedmodel import SavedModelError, meta_graph, read_saved_model

PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
DEFAULT_SIGNATURE = "serving_default"
# TF2 exports carry this pseudo-signature; it runs initializers and is never served.
INIT_OP_SIGNATURE = "__saved_model_init_op"


@dataclass(frozen=True)
class TensorSpec:
    alias: str  # the key clients use (signature input/output name)
    tensor_name: str  # the graph tensor, e.g. "x:0" (or the LiteRT tensor name)
    dtype: int  # tensorflow DataType enum value
    shape: tuple[int, ...] | None  # None: unknown rank; -1: unknown dimension

    @property
    def numpy_dtype(self) -> np.dtype:
        return dtypes.to_numpy(self.dtype)

    def describe(self) -> str:
        """``image: uint8 [-1, 28, 28]``, as error messages show a tensor."""
        dims = "?" if self.shape is None else "[" + ", ".join(str(d) for d in self.shape) + "]"
        dtype = "string" if dtypes.is_string(self.dtype) else self.numpy_dtype.name
        return f"{self.alias}: {dtype} {dims}"

    def shape_mismatch(self, shape: tuple[int, ...], any_batch: bool = False) -> str | None:
        """Why an input of ``shape`` cannot be this tensor, or None when it can: the one shape rule and
        message of every protocol (V2 checks it first; TF Serving's REST and gRPC APIs, and batch jobs,
        once the model refused the input: ``inference.shape_failure``), so a wrong shape never answers
        with a runtime's internals (TensorFlow's reshape node). ``any_batch``: the first dimension is free
        (a batch job makes its own batches)."""
        wanted = self.shape
        if wanted is None:  # unknown rank: anything goes
            return None
        if any_batch and wanted:
            wanted = (-1, *wanted[1:])
        if len(wanted) == len(shape):
            for want, got in zip(wanted, shape):  # a loop, not any(generator): cheaper for a shape's few sizes
                if want >= 0 and want != got:
                    break
            else:
                return None
        return f"input '{self.alias}' has shape {list(shape)}; the model expects {list(wanted)} (-1: any size)"


@dataclass(frozen=True)
class Signature:
    name: str
    method_name: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    # Default values for inputs the client may omit (TF2 SignatureDef.defaults).
    defaults: dict[str, np.ndarray] = field(default_factory=dict)


def specs_from_signature_def(tensor_map) -> dict[str, TensorSpec]:
    specs = {}
    for alias, info in tensor_map.items():
        shape = None if info.tensor_shape.unknown_rank else tuple(d.size for d in info.tensor_shape.dim)
        specs[alias] = TensorSpec(alias, info.name, info.dtype, shape)
    return specs


def from_signature_def(name: str, signature_def) -> Signature:
    defaults = {}
    if getattr(signature_def, "defaults", None):  # only when there are some: it loads TensorFlow
        import tensorflow as tf  # through the package (tf.make_ndarray), so a deferred one loads first

        defaults = {k: tf.make_ndarray(v) for k, v in signature_def.defaults.items()}
    return Signature(
        name=name,
        method_name=signature_def.method_name,
        inputs=specs_from_signature_def(signature_def.inputs),
        outputs=specs_from_signature_def(signature_def.outputs),
        defaults=defaults,
    )


def read_signature(version_dir: str | Path, name: str = DEFAULT_SIGNATURE) -> Signature:
    """The ``name`` signature of a SavedModel's 'serve' MetaGraph, read without loading TensorFlow's runtime."""
    graph = meta_graph(read_saved_model(version_dir))
    if name not in graph.signature_def:
        have = ", ".join(sorted(graph.signature_def)) or "none"
        raise SavedModelError(f"{version_dir} has no signature {name!r} (signatures: {have})")
    return from_signature_def(name, graph.signature_def[name])
