"""The runtime choice: serve a SavedModel's signatures through LiteRT when that gives TF's numbers.

``auto`` converts each numeric predict-style signature to a TFLite flatbuffer at load
time, runs both runtimes on sample inputs, and keeps LiteRT only where outputs match
(same dtypes and shapes, max abs difference <= 1e-5 relative). Everything else, and
every signature taking serialized Examples, stays on the TensorFlow session, which also
answers any request LiteRT refuses (so errors are TensorFlow's, as in TF Serving).
``litert`` insists for every signature LiteRT can take: one that cannot be converted or
does not match fails the load. Signatures LiteRT cannot take at all (serialized Examples,
strings, inputs of unknown shape: classify and regress) stay on TensorFlow under every
runtime, so TF Serving's models still load, and the log says so.
Where TensorFlow's runtime is not installed (the slim serving image holds only its message modules:
``model.graph.messages_only``), or under ``graph``, SavedModels run on the TensorFlow-free executor of
``model.graph``, which refuses at load, naming them, the ops it has no kernel for.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import numpy as np

from modelyard.errors import Code, ServingError
from modelyard.model.runtime import litert_cache
from modelyard.model.runtime.litert import AliasedRunner, LiteRTRunner
from modelyard.model.runtime.litert_first import LiteRTFirstServable, litert_can_take
from modelyard.model.runtime.servable import Servable
from modelyard.model.tflite import convert_saved_model
from modelyard.model.signatures import Signature

log = logging.getLogger("modelyard.serving")

RUNTIMES = ("auto", "tensorflow", "litert", "graph")
TOLERANCE = 1e-5
SAMPLE_BATCHES = (1, 3)

def sample_inputs(sig: Signature, batch: int, seed: int = 0) -> dict[str, np.ndarray] | None:
    """Plausible inputs for ``sig`` at ``batch`` rows, or None when shapes or dtypes can't be guessed."""
    if not litert_can_take(sig):
        return None
    rng = np.random.default_rng(seed)
    out = {}
    for alias, spec in sig.inputs.items():
        shape = (batch,) + tuple(spec.shape[1:])
        dtype = spec.numpy_dtype
        if dtype.kind == "f":
            out[alias] = rng.normal(size=shape).astype(dtype)
        elif dtype == np.uint8:
            out[alias] = rng.integers(0, 256, size=shape, dtype=np.uint8)
        elif dtype.kind in "iu":
            out[alias] = rng.integers(0, 10, size=shape).astype(dtype)
        else:  # bool, the one kind left that LiteRT can take
            out[alias] = rng.integers(0, 2, size=shape).astype(bool)
    return out


def _matches(expected: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> str | None:
    for alias, ref in expected.items():
        value = got[alias]
        if value.dtype != ref.dtype or value.shape != ref.shape:
            return f"output {alias}: {value.dtype}{list(value.shape)} vs TensorFlow's {ref.dtype}{list(ref.shape)}"
        if ref.dtype.kind in "fc":
            scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
            diff = float(np.max(np.abs(value - ref))) if ref.size else 0.0
            if not diff <= TOLERANCE * scale:
                return f"output {alias}: max abs difference {diff:.3g} > {TOLERANCE} relative"
        elif not np.array_equal(value, ref):
            return f"output {alias}: values differ"
    return None


def _convert(session: Servable, sig: Signature) -> tuple[bytes, AliasedRunner]:
    """The flatbuffer, and its runner addressed by the signature's aliases."""
    # fd 2 stays open: other threads of the server log while this converts.
    content = convert_saved_model(session.path, sig, hold_native_stderr=False)
    runner = LiteRTRunner(content, sig.name)

    def keys(specs, available):
        mapping = {}
        for alias, spec in specs.items():
            for candidate in (alias, spec.tensor_name.split(":")[0]):
                if candidate in available:
                    mapping[alias] = candidate
                    break
            else:
                raise ValueError(f"converted model has no tensor for {alias}")
        return mapping

    return content, AliasedRunner(runner, keys(sig.inputs, runner.inputs), keys(sig.outputs, runner.outputs))


def choose_runtime(session: Servable, runtime: str, key: str | None = None) -> Servable:
    """Return ``session`` itself (tensorflow) or a LiteRTFirstServable over it, with verified LiteRT signatures.
    ``key``: ``litert_cache.key_of(session.path)`` when the caller has hashed the model already."""
    if runtime == "tensorflow":
        return session
    fast = {}
    key = key or litert_cache.key_of(session.path)
    for name, sig in session.signatures.items():
        reason = None
        if not litert_can_take(sig):
            # No runtime choice to make: LiteRT takes no serialized Examples or strings.
            log.info("Signature %s of %s stays on TensorFlow: LiteRT cannot take inputs of unknown shape or "
                 "non-numeric dtype", name, session.path)
            continue
        cached = litert_cache.load(session.path, name, key) if key else None
        if cached is not None and cached[0] == sig:
            # Checked against TensorFlow when these bytes were first converted, under these versions.
            _, content, in_keys, out_keys = cached
            fast[name] = AliasedRunner(LiteRTRunner(content, name), in_keys, out_keys)
            log.info("Signature %s of %s runs on LiteRT (outputs match TensorFlow), as checked at its first "
                     "conversion (cached)", name, session.path)
            continue
        try:
            content, candidate = _convert(session, sig)
            trial = LiteRTFirstServable.over_session(session, {name: candidate})
            for sample in (sample_inputs(sig, b, seed=b) for b in SAMPLE_BATCHES):
                expected = session.run(sig, sample, tuple(sig.outputs))
                reason = _matches(expected, trial.run(sig, sample, tuple(sig.outputs)))
                if reason:
                    break
            if not reason:
                fast[name] = candidate
                litert_cache.store(session.path, sig, content, candidate.in_keys, candidate.out_keys, key)
        except Exception as exc:  # the converter raises many types; any failure means "stay on TF"
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if reason:
            if runtime == "litert":
                raise ServingError(Code.FAILED_PRECONDITION, f"--runtime litert cannot serve signature {name}: {reason}")
            log.info("Signature %s of %s stays on TensorFlow: %s", name, session.path, reason)
        else:
            log.info("Signature %s of %s runs on LiteRT (outputs match TensorFlow)", name, session.path)
    return LiteRTFirstServable.over_session(session, fast) if fast else session


def tensorflow_installed() -> bool:
    """Whether TensorFlow's runtime can be imported: not when only its message modules are installed
    (``messages_only``'s package, the slim image's) or an import of it is blocked. Reads no more than
    the package's ``__init__.py``: TensorFlow itself is not imported here."""
    from modelyard.model.graph.messages_only import MARKER

    if "tensorflow" in sys.modules and sys.modules["tensorflow"] is None:
        return False
    try:
        spec = importlib.util.find_spec("tensorflow")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin:
        return False
    try:
        return MARKER not in Path(spec.origin).read_text()
    except OSError:
        return False


def graph_servable(path: Path, runtime: str) -> Servable | None:
    """The version at ``path`` on the TensorFlow-free graph runtime when ``runtime`` is ``graph`` or
    TensorFlow is not installed; None otherwise. ``tensorflow`` and ``litert`` need TensorFlow: without
    it they fail the load, saying so."""
    if runtime != "graph" and tensorflow_installed():
        return None
    if runtime in ("tensorflow", "litert"):
        raise ServingError(Code.FAILED_PRECONDITION,
                           f"--runtime {runtime} needs TensorFlow, which is not installed here (the slim serving "
                           "image holds none: use --runtime auto, or the modelyard-serving:full image)")
    from modelyard.model.runtime.graph_servable import load_graph

    servable = load_graph(path)
    for name in servable.signatures:
        log.info("Signature %s of %s runs on the graph runtime (NumPy kernels, no TensorFlow)", name, path)
    return servable


def cached_servable(path: Path, runtime: str, session_config=None) -> Servable | None:
    """The version at ``path`` on its cached, verified LiteRT conversions, without loading TensorFlow
    (a ``LiteRTFirstServable`` that loads a session on first need), when every signature LiteRT can take has one for these
    bytes; None otherwise (a miss, a signature LiteRT failed to match, an unreadable SavedModel):
    then ``choose_runtime`` decides over a loaded session, as on a first load. Where TensorFlow is not
    installed, or under ``graph``: the graph runtime's servable (``graph_servable``)."""
    graph = graph_servable(path, runtime)
    if graph is not None:
        return graph
    if runtime == "tensorflow":
        return None
    from modelyard.model.savedmodel import SavedModelError, meta_graph, read_saved_model
    from modelyard.model.signatures import INIT_OP_SIGNATURE, from_signature_def

    key = litert_cache.key_of(path)
    if key is None:
        return None
    try:
        graph = meta_graph(read_saved_model(path))
        signatures = {name: from_signature_def(name, sig) for name, sig in graph.signature_def.items()
                      if name != INIT_OP_SIGNATURE}
    except (SavedModelError, ValueError, TypeError):  # the session's load words what is wrong
        return None
    fast = {}
    for name, sig in signatures.items():
        if not litert_can_take(sig):
            continue  # LiteRT cannot take it under any runtime: the session answers it when asked
        cached = litert_cache.load(path, name, key)
        if cached is None or cached[0] != sig:
            return None
        _, content, in_keys, out_keys = cached
        fast[name] = AliasedRunner(LiteRTRunner(content, name), in_keys, out_keys)
    if not fast:
        return None  # nothing for LiteRT: a session servable, as choose_runtime would give
    for name in signatures:
        log.info("Signature %s of %s %s", name, path, "runs on LiteRT (outputs match TensorFlow), as checked at "
                 "its first conversion (cached); TensorFlow is loaded only for what LiteRT refuses"
                 if name in fast else "stays on TensorFlow (LiteRT cannot take its inputs), loaded when first asked")
    return LiteRTFirstServable(path, signatures, fast, graph.signature_def, session_config=session_config,
                               from_cache=True)
