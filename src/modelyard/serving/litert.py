"""The LiteRT backend: a version directory holding ``model.tflite``, run by the LiteRT interpreter.

Signatures come from the flatbuffer's SignatureDefs; a model without any is served as
``serving_default`` over its input and output tensors, named as in the file.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from modelyard.errors import Code, ServingError
from modelyard.serving import dtypes
from modelyard.serving.servable import Servable
from modelyard.serving.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec


def _spec(alias: str, detail: dict) -> TensorSpec:
    shape = tuple(int(d) for d in detail.get("shape_signature", detail["shape"]))
    return TensorSpec(alias, detail["name"], dtypes.from_numpy(detail["dtype"]), shape)


def _signature_def_map(signatures: dict[str, Signature]):
    """Describe LiteRT signatures in SignatureDef form so metadata answers as for SavedModels."""
    from tensorflow_serving.apis import get_model_metadata_pb2

    sig_map = get_model_metadata_pb2.SignatureDefMap()
    for name, sig in signatures.items():
        sig_def = sig_map.signature_def[name]
        sig_def.method_name = sig.method_name
        for target, specs in ((sig_def.inputs, sig.inputs), (sig_def.outputs, sig.outputs)):
            for alias, spec in specs.items():
                info = target[alias]
                info.name = spec.tensor_name
                info.dtype = spec.dtype
                for size in spec.shape or ():
                    info.tensor_shape.dim.add(size=size)
    return sig_map.signature_def


class LiteRTServable(Servable):
    runtime = "litert"

    def __init__(self, path: Path, model_file: Path):
        from ai_edge_litert.interpreter import Interpreter

        self._interpreter = Interpreter(model_path=str(model_file))
        self._lock = threading.Lock()  # an interpreter runs one call at a time
        listed = self._interpreter.get_signature_list()
        self._runners = {}
        signatures = {}
        if listed:
            for name in listed:
                runner = self._interpreter.get_signature_runner(name)
                self._runners[name] = runner
                signatures[name] = Signature(
                    name,
                    PREDICT_METHOD,
                    {a: _spec(a, d) for a, d in runner.get_input_details().items()},
                    {a: _spec(a, d) for a, d in runner.get_output_details().items()},
                )
        else:
            self._interpreter.allocate_tensors()
            inputs = {d["name"]: d for d in self._interpreter.get_input_details()}
            outputs = {d["name"]: d for d in self._interpreter.get_output_details()}
            self._input_index = {a: d["index"] for a, d in inputs.items()}
            self._output_index = {a: d["index"] for a, d in outputs.items()}
            signatures[DEFAULT_SIGNATURE] = Signature(
                DEFAULT_SIGNATURE,
                PREDICT_METHOD,
                {a: _spec(a, d) for a, d in inputs.items()},
                {a: _spec(a, d) for a, d in outputs.items()},
            )
        super().__init__(path, signatures, _signature_def_map(signatures))

    def run(self, signature, inputs, output_aliases):
        try:
            with self._lock:
                if self._runners:
                    results = self._runners[signature.name](**inputs)
                    return {a: np.copy(results[a]) for a in output_aliases}
                return self._run_plain(inputs, output_aliases)
        except ValueError as exc:
            raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None
        except RuntimeError as exc:
            raise ServingError(Code.INTERNAL, str(exc)) from None

    def _run_plain(self, inputs, output_aliases):
        it = self._interpreter
        resized = False
        for alias, value in inputs.items():
            index = self._input_index[alias]
            if tuple(it.get_tensor(index).shape) != value.shape:
                it.resize_tensor_input(index, value.shape)
                resized = True
        if resized:
            it.allocate_tensors()
        for alias, value in inputs.items():
            it.set_tensor(self._input_index[alias], value)
        it.invoke()
        return {a: it.get_tensor(self._output_index[a]) for a in output_aliases}


def load_tflite(path: Path, model_file: Path) -> LiteRTServable:
    return LiteRTServable(path, model_file)
