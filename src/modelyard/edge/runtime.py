"""Running both sides of a comparison: the original SavedModel and the converted flatbuffer.

The original runs in a ``tf.compat.v1`` session through its SignatureDef (this loads
TF1 and TF2 exports alike). The flatbuffer runs in LiteRT; integer I/O tensors are
quantized/dequantized with their own scale and zero point so both sides speak floats.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from modelyard.model.signatures import Signature


def run_saved_model(version_dir: Path, signature: Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of the original model for a whole batch, keyed by output alias."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        tf.compat.v1.saved_model.loader.load(session, ["serve"], str(version_dir))
        feed = {signature.inputs[a].tensor_name: v for a, v in inputs.items()}
        fetch = {a: s.tensor_name for a, s in signature.outputs.items()}
        return session.run(fetch, feed)


class LiteModel:
    """A ``.tflite`` flatbuffer in a LiteRT interpreter, addressed by signature aliases."""

    def __init__(self, content: bytes, input_order: list[str] | None = None, output_order: list[str] | None = None):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_content=content)
        signatures = self.interpreter.get_signature_list()
        if signatures:
            # A signature runner pins the interpreter's buffers (no resize afterwards), so
            # read the alias -> tensor mapping from a throwaway interpreter instead.
            runner = Interpreter(model_content=content).get_signature_runner(next(iter(signatures)))
            self.inputs = runner.get_input_details()
            self.outputs = runner.get_output_details()
            del runner
        else:
            # Session conversions carry no signature: tensors follow the order they were given in.
            ins, outs = self.interpreter.get_input_details(), self.interpreter.get_output_details()
            self.inputs = dict(zip(input_order or [d["name"] for d in ins], ins))
            self.outputs = dict(zip(output_order or [d["name"] for d in outs], outs))
        self.interpreter.allocate_tensors()

    def _input(self, alias: str) -> dict:
        if alias in self.inputs:
            return self.inputs[alias]
        if len(self.inputs) == 1:
            # Keras conversions name the input after the layer, which may differ from the alias.
            return next(iter(self.inputs.values()))
        raise KeyError(f"the flatbuffer has no input {alias!r} (inputs: {sorted(self.inputs)})")

    def _set(self, alias: str, value: np.ndarray) -> None:
        detail = self._input(alias)
        dtype = detail["dtype"]
        scale, zero = detail["quantization"]
        if value.dtype != dtype and np.issubdtype(dtype, np.integer) and scale:
            info = np.iinfo(dtype)
            value = np.clip(np.round(value / scale + zero), info.min, info.max)
        self.interpreter.set_tensor(detail["index"], np.ascontiguousarray(value, dtype=dtype))

    def _get(self, alias: str) -> np.ndarray:
        detail = self.outputs[alias]
        value = self.interpreter.get_tensor(detail["index"])
        scale, zero = detail["quantization"]
        if np.issubdtype(value.dtype, np.integer) and scale:
            return (value.astype(np.float32) - zero) * scale
        return value

    def _resize(self, batch: int) -> None:
        for detail in self.inputs.values():
            shape = list(detail["shape"])
            if shape and shape[0] != batch:
                shape[0] = batch
                self.interpreter.resize_tensor_input(detail["index"], shape)
        self.interpreter.allocate_tensors()
        # Details (shapes) change on resize; re-read them by index.
        by_index = {d["index"]: d for d in self.interpreter.get_input_details()}
        self.inputs = {a: by_index.get(d["index"], d) for a, d in self.inputs.items()}

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch (any size) and return float outputs keyed by alias."""
        batch = len(next(iter(inputs.values())))
        self._resize(batch)
        for alias, value in inputs.items():
            self._set(alias, value)
        self.interpreter.invoke()
        return {alias: self._get(alias) for alias in self.outputs}

    def median_latency_us(self, sample: dict[str, np.ndarray], runs: int = 200, warmup: int = 10) -> float:
        """Median wall time of ``invoke()`` on one batch-1 sample (inputs set once, outside the timing)."""
        self._resize(1)
        for alias, value in sample.items():
            self._set(alias, value[:1])
        for _ in range(warmup):
            self.interpreter.invoke()
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            self.interpreter.invoke()
            times.append(time.perf_counter() - started)
        return float(np.median(times) * 1e6)
