"""The input/output contract of the signature being converted, read from ``saved_model.pb``.

Used to check representative and evaluation data before any conversion starts,
and to feed the original model by tensor name.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelyard.edge.errors import ConvertError
from modelyard.savedmodel import SavedModelError, meta_graph, read_saved_model
from modelyard.serving.dtypes import to_numpy  # the one dtype table, shared with serving

DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class TensorSpec:
    alias: str  # the signature's key, e.g. "image"
    tensor_name: str  # the graph tensor, e.g. "serving_default_image:0"
    dtype: np.dtype
    shape: tuple[int | None, ...] | None  # None: unknown rank

    def describe(self) -> str:
        dims = "?" if self.shape is None else "[" + ", ".join("-1" if d is None else str(d) for d in self.shape) + "]"
        dtype = "string" if self.dtype.kind == "O" else self.dtype.name
        return f"{self.alias}: {dtype} {dims}"


@dataclass(frozen=True)
class SignatureSpec:
    name: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    is_tf1: bool  # no TF2 object graph: convert through a session


def _spec(alias: str, info) -> TensorSpec:
    shape = None if info.tensor_shape.unknown_rank else tuple(
        None if d.size < 0 else int(d.size) for d in info.tensor_shape.dim
    )
    return TensorSpec(alias, info.name, to_numpy(info.dtype), shape)


def read_signature(version_dir: Path, name: str = DEFAULT_SIGNATURE) -> SignatureSpec:
    """The ``name`` signature of the SavedModel's 'serve' MetaGraph."""
    try:
        graph = meta_graph(read_saved_model(version_dir))
    except SavedModelError as exc:
        raise ConvertError(str(exc)) from exc
    if name not in graph.signature_def:
        have = ", ".join(sorted(graph.signature_def)) or "none"
        raise ConvertError(f"{version_dir} has no signature {name!r} (signatures: {have})")
    sig = graph.signature_def[name]
    return SignatureSpec(
        name=name,
        inputs={a: _spec(a, i) for a, i in sorted(sig.inputs.items())},
        outputs={a: _spec(a, i) for a, i in sorted(sig.outputs.items())},
        is_tf1=len(graph.object_graph_def.nodes) == 0,
    )
