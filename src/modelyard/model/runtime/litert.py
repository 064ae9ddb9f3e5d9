"""The LiteRT backend: ``.tflite`` flatbuffers run by the LiteRT interpreter.

Serves version directories holding ``model.tflite`` (signatures from the flatbuffer, or
``serving_default`` over its tensors when it has none), and runs signatures that the
``auto`` runtime converted from a SavedModel.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np

from modelyard.errors import Code, ServingError
from modelyard.model import dtypes
from modelyard.model.runtime.servable import Servable
from modelyard.model.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec


class LiteRTRunner:
    """One interpreter addressed by tensor key (signature alias, or tensor name when unsigned).

    Inputs are resized only when their shape changes: re-allocating tensors on every
    call would cost more than a small model's whole invoke.
    """

    def __init__(self, content: bytes, signature_key: str | None = None):
        from ai_edge_litert.interpreter import Interpreter

        self._interpreter = Interpreter(model_content=content, num_threads=1)
        listed = self._interpreter.get_signature_list()
        if listed:
            key = signature_key if signature_key in listed else next(iter(listed))
            # A signature runner pins its interpreter's buffers, so read the alias -> tensor
            # mapping from a throwaway interpreter and drive this one by tensor index.
            probe = Interpreter(model_content=content).get_signature_runner(key)
            self.inputs = probe.get_input_details()
            self.outputs = probe.get_output_details()
        else:
            self.inputs = {d["name"]: d for d in self._interpreter.get_input_details()}
            self.outputs = {d["name"]: d for d in self._interpreter.get_output_details()}
        self._interpreter.allocate_tensors()
        self._shapes = {k: tuple(d["shape"]) for k, d in self.inputs.items()}
        self._lock = threading.Lock()  # an interpreter runs one call at a time

    def run(self, inputs: dict[str, np.ndarray], output_keys) -> dict[str, np.ndarray]:
        it = self._interpreter
        with self._lock:
            wanted = {key: value.shape for key, value in inputs.items() if self._shapes[key] != value.shape}
            if wanted:
                self._reshape(wanted)
            for key, value in inputs.items():
                it.set_tensor(self.inputs[key]["index"], value)
            it.invoke()
            return {k: it.get_tensor(self.outputs[k]["index"]) for k in output_keys}

    def _reshape(self, wanted: dict[str, tuple]) -> None:
        """Resize inputs; shapes the model's kernels cannot take are the request's error (400)."""
        it = self._interpreter
        before = dict(self._shapes)
        try:
            for key, shape in wanted.items():
                it.resize_tensor_input(self.inputs[key]["index"], shape)
                self._shapes[key] = shape
            it.allocate_tensors()
        except (RuntimeError, ValueError) as exc:
            # Put back the shapes that worked, so the next request finds a usable interpreter.
            for key, shape in before.items():
                it.resize_tensor_input(self.inputs[key]["index"], shape)
            it.allocate_tensors()
            self._shapes = before
            shapes = ", ".join(f"{key} {list(shape)}" for key, shape in wanted.items())
            raise ServingError(Code.INVALID_ARGUMENT, f"The model cannot take input shape {shapes}: {exc}") from None


def _spec(alias: str, detail: dict) -> TensorSpec:
    shape = tuple(int(d) for d in detail.get("shape_signature", detail["shape"]))
    return TensorSpec(alias, detail["name"], dtypes.from_numpy(detail["dtype"]), shape)


def signature_def_map(signatures: dict[str, Signature]):
    """Describe signatures in SignatureDef form so metadata answers as for SavedModels."""
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


def _run_checked(runner: LiteRTRunner, inputs, output_keys):
    try:
        return runner.run(inputs, output_keys)
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None
    except RuntimeError as exc:
        raise ServingError(Code.INTERNAL, str(exc)) from None


class AliasedRunner(NamedTuple):
    """A runner driven by signature alias: ``in_keys`` / ``out_keys`` map aliases to its tensor keys
    (a converted SavedModel signature's tensors may be named otherwise)."""

    runner: LiteRTRunner
    in_keys: dict
    out_keys: dict

    def run(self, inputs: dict[str, np.ndarray], output_aliases) -> dict[str, np.ndarray]:
        """The outputs by alias; ServingError when LiteRT refuses the inputs."""
        results = _run_checked(self.runner, {self.in_keys[a]: v for a, v in inputs.items()},
                               [self.out_keys[a] for a in output_aliases])
        return {a: results[self.out_keys[a]] for a in output_aliases}


class LiteRTServable(Servable):
    """A version directory holding ``model.tflite``."""

    runtime = "litert"
    inline_ok = True

    def __init__(self, path: Path, model_file: Path):
        from ai_edge_litert.interpreter import Interpreter

        content = model_file.read_bytes()
        keys = list(Interpreter(model_content=content).get_signature_list()) or [DEFAULT_SIGNATURE]
        self._runners = {key: LiteRTRunner(content, key) for key in keys}
        signatures = {
            key: Signature(
                key,
                PREDICT_METHOD,
                {a: _spec(a, d) for a, d in runner.inputs.items()},
                {a: _spec(a, d) for a, d in runner.outputs.items()},
            )
            for key, runner in self._runners.items()
        }
        super().__init__(path, signatures, signature_def_map(signatures))

    def run(self, signature, inputs, output_aliases):
        return _run_checked(self._runners[signature.name], inputs, output_aliases)


def load_tflite(path: Path, model_file: Path) -> LiteRTServable:
    return LiteRTServable(path, model_file)
