"""Pin a converted model's batch dimension: runtimes without dynamic shapes (LiteRT.js) refuse ``-1``.

The converter writes each tensor's runtime shape (``shape``, batch 1) and its declared one
(``shape_signature``, batch ``-1``). Making the declared batch the concrete one leaves
every kernel as converted; shapes computed at run time (``Shape`` -> ``Reshape``) still
compute, now always with batch 1.
"""
from __future__ import annotations

from modelyard.model.tflite import ConvertError


def fix_batch_size(content: bytes, batch: int = 1) -> bytes:
    """Return ``content`` with every leading ``-1`` of a declared shape set to ``batch``."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            signature = tensor.shapeSignature
            if signature is None or len(signature) == 0:
                continue
            if any(int(d) < 0 for d in signature[1:]):
                name = tensor.name.decode() if isinstance(tensor.name, bytes) else tensor.name
                raise ConvertError(
                    f"tensor {name!r} has a dynamic dimension other than the batch "
                    f"({list(map(int, signature))}): export the model with fixed shapes for the web"
                )
            if int(signature[0]) < 0:
                signature[0] = batch
                tensor.shape[0] = batch
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))
