"""The Open Inference Protocol (KServe V2) over the core: health, metadata, readiness, infer.

Protocol-free, shared by ``v2_rest`` and ``v2_grpc``: both decode their tensors
(``v2_tensors``), call here, and encode what comes back. Models, version resolution,
errors and metrics are TF Serving's path (``ServingCore``): a V2 version string is a
version number or a version label, empty means the latest; the model's ``serving_default``
signature names and types the tensors.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

from modelyard import __version__
from modelyard.errors import ServingError, invalid_argument
from modelyard.model import dtypes
from modelyard.model.runtime import inference
from modelyard.model.signatures import DEFAULT_SIGNATURE, Signature, TensorSpec
from modelyard.serving.core import ModelSpec, ServingCore
from modelyard.serving.protocol.v2_tensors import V2Tensor

if TYPE_CHECKING:
    from modelyard.serving.core import QueuedPredict

SERVER_NAME = "modelyard"
EXTENSIONS = ("binary_tensor_data", "model_repository")
PLATFORM = "tensorflow_savedmodel"


class InferResult(NamedTuple):
    model_name: str
    model_version: int
    outputs: dict[str, np.ndarray]  # in the order asked for (all of the signature's when none was)


@lru_cache(maxsize=512)  # a ModelSpec is frozen: one per name and version string; errors are not cached
def model_spec(name: str, version: str | None) -> ModelSpec:
    """V2's ``/v2/models/{name}[/versions/{version}]``: a number, a label, or the latest when empty."""
    if not name:
        raise invalid_argument("missing model name")
    if not version:
        return ModelSpec(name)
    if version.isdigit():
        number = int(version)
        if number >= 2**63:
            raise invalid_argument(f"version {version} is out of range")
        return ModelSpec(name, number)
    return ModelSpec(name, None, version)


def tensor_metadata(spec: TensorSpec) -> dict:
    shape = [-1] if spec.shape is None else list(spec.shape)
    return {"name": spec.alias, "datatype": dtypes.v2_datatype(spec.dtype), "shape": shape}


class V2Service:
    """Every V2 call both adapters make, on one ``ServingCore``."""

    def __init__(self, core: ServingCore):
        self.core = core

    # ---- health ---------------------------------------------------------------------------
    @staticmethod
    def live() -> bool:
        return True

    def ready(self) -> bool:
        """Ready when every configured model has a version to serve (ports open once loads settled)."""
        manager = self.core.manager
        names = manager.model_names()
        return bool(names) and all(
            any(r.state == "AVAILABLE" for r in manager.version_states(n)) for n in names)

    @staticmethod
    def server_metadata() -> dict:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    def model_ready(self, name: str, version: str | None) -> bool:
        try:
            with self.core.acquire(model_spec(name, version)):
                return True
        except ServingError:
            return False

    # ---- metadata -------------------------------------------------------------------------
    def model_metadata(self, name: str, version: str | None) -> dict:
        spec = model_spec(name, version)
        with self.core.acquire(spec) as handle:
            sig = self._signature(handle.servable)
            if spec.version is None and spec.label is None:
                versions = [str(r.version) for r in self.core.manager.version_states(name) if r.state == "AVAILABLE"]
            else:
                versions = [str(handle.version)]
        return {
            "name": name,
            "versions": versions,
            "platform": PLATFORM,
            "inputs": [tensor_metadata(t) for t in sig.inputs.values()],
            "outputs": [tensor_metadata(t) for t in sig.outputs.values()],
        }

    @staticmethod
    def _signature(servable) -> Signature:
        return inference.predict_signature(servable, DEFAULT_SIGNATURE)

    # ---- inference ------------------------------------------------------------------------
    def infer(self, name: str, version: str | None, inputs: list[V2Tensor], outputs: list[str] | None,
              entrypoint: str) -> InferResult:
        """Run ``inputs`` through the model's default signature; ``outputs`` None means all of them."""
        spec = model_spec(name, version)
        core = self.core
        with core.request(name, "Predict", entrypoint):
            with core.acquire(spec) as handle:
                sig = self._signature(handle.servable)
                arrays = check_inputs(name, sig, inputs)
                _, results = core.predict(handle, sig.name, arrays, outputs)
                return InferResult(name, handle.version, results)


    def queue_infer(self, name: str, version: str | None, read: Callable[[], tuple], entrypoint: str,
                    deadline: float | None, executor) -> "QueuedPredict | None":
        """``infer`` on a batching model without blocking (``ServingCore.queue_predict``, as TF Serving's
        predicts): None when the model does not batch (call ``infer``), else a ``QueuedPredict``.

        ``read()`` decodes the request: ``(inputs, output names or None, encode)``; ``encode(InferResult)``
        makes the protocol's answer once the batch has run. Errors raise here, counted as ``infer``'s."""
        try:
            spec = model_spec(name, version)
        except ServingError:
            return None  # infer answers it

        def read_request(handle):
            inputs, outputs, encode = read()
            sig = self._signature(handle.servable)
            arrays = check_inputs(name, sig, inputs)
            return sig.name, arrays, lambda queued, results: encode(InferResult(name, queued.version, results)), \
                outputs

        return self.core.queue_predict(spec, "Predict", entrypoint, read_request, None, deadline, executor)


def check_inputs(model: str, sig: Signature, inputs: list[V2Tensor]) -> dict[str, np.ndarray]:
    """V2's own checks of declared names, datatypes and shapes against the signature (then the core's)."""
    arrays: dict[str, np.ndarray] = {}
    for tensor in inputs:
        spec = sig.inputs.get(tensor.name)
        if spec is None:
            raise invalid_argument(
                f"unexpected inference input '{tensor.name}' for model '{model}'; its inputs are "
                f"{', '.join(sorted(sig.inputs))}")
        if tensor.name in arrays:
            raise invalid_argument(f"input '{tensor.name}' is given more than once")
        expected = dtypes.v2_datatype(spec.dtype)
        if tensor.datatype != expected:
            raise invalid_argument(
                f"input '{tensor.name}' of model '{model}' has datatype {tensor.datatype}; the model expects "
                f"{expected}" + dtypes.sending_hint(spec.dtype))
        mismatch = spec.shape_mismatch(tensor.shape)
        if mismatch is not None:
            raise invalid_argument(mismatch)
        arrays[tensor.name] = tensor.array
    # Every name was checked above, so with as many inputs as the signature's none is missing.
    missing = sorted(set(sig.inputs) - set(arrays) - set(sig.defaults)) if len(arrays) < len(sig.inputs) else ()
    if missing:
        raise invalid_argument(f"model '{model}' expects input(s) {', '.join(missing)} which the request lacks")
    return arrays
