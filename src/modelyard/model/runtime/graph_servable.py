"""A SavedModel served by the TensorFlow-free executor (``model.graph.program``): the ``graph`` runtime.

``load_graph`` reads the 'serve' MetaGraph, refuses a graph with ops outside ``ops.KERNELS`` (naming
them), restores the variables and runs the init op as TensorFlow's loader does, and compiles each
signature on first use, per set of outputs asked for. Signatures and ``signature_def_map`` come from
the MetaGraphDef itself, so metadata answers as with TensorFlow.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from modelyard.errors import Code, ServingError
from modelyard.model.graph.program import Graph, GraphError, Plan, Program, check_supported, tensor_ref
from modelyard.model.runtime.servable import Servable
from modelyard.model.savedmodel import SavedModelError, meta_graph, read_saved_model
from modelyard.model.signatures import INIT_OP_SIGNATURE, Signature, from_signature_def

log = logging.getLogger("modelyard.serving")

VARIABLES = Path("variables") / "variables"
ASSETS = "assets"
_INIT_COLLECTIONS = ("saved_model_main_op", "legacy_init_op")
# Models run inline on the event loop (as small LiteRT ones are): at most this many weights, none of these ops.
INLINE_WEIGHTS = 500_000
HEAVY_OPS = frozenset({"Conv2D", "DepthwiseConv2dNative", "MaxPool", "AvgPool", "BatchMatMul", "BatchMatMulV2",
                       "BatchMatMulV3", "Einsum", "ParseExample", "ParseExampleV2"})


class GraphServable(Servable):
    """A SavedModel version run by ``program``'s NumPy kernels, without TensorFlow."""

    runtime = "graph"

    def __init__(self, path: Path, program: Program, signatures: dict[str, Signature], signature_def_map):
        super().__init__(path, signatures, signature_def_map)
        self._program = program
        self._plans: dict[tuple, Plan] = {}
        self._lock = threading.Lock()

    def plan(self, signature: Signature, output_aliases: tuple[str, ...]) -> Plan:
        key = (signature.name, tuple(output_aliases))
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:  # folding writes the program's shared constants: one compile at a time
                plan = self._plans.get(key)
                if plan is None:
                    plan = self._compile(signature, output_aliases)
                    self._plans[key] = plan
        return plan

    def _compile(self, signature: Signature, output_aliases) -> Plan:
        feeds = [tensor_ref(signature.inputs[a].tensor_name) for a in sorted(signature.inputs)]
        fetches = [tensor_ref(signature.outputs[a].tensor_name) for a in output_aliases]
        try:
            plan = self._program.compile(feeds, fetches)
        except GraphError as exc:
            raise ServingError(Code.INTERNAL, f"signature {signature.name}: {exc}") from None
        plan.feed_aliases = tuple(sorted(signature.inputs))
        dtypes = [signature.outputs[a].numpy_dtype for a in output_aliases]
        plan.fetch_dtypes = tuple(None if d.kind == "O" else d for d in dtypes)
        return plan

    def run(self, signature, inputs, output_aliases):
        plan = self._plans.get((signature.name, output_aliases)) or self.plan(signature, tuple(output_aliases))
        values = plan.run([inputs[a] for a in plan.feed_aliases])
        out = {}
        for alias, value, want in zip(output_aliases, values, plan.fetch_dtypes):
            if type(value) is not np.ndarray:
                value = np.asarray(value)
            out[alias] = value if want is None or value.dtype == want else value.astype(want)
        return out

    def close(self) -> None:
        self._plans.clear()


def _init_op(graph_meta) -> str | None:
    init = graph_meta.signature_def.get(INIT_OP_SIGNATURE)
    if init is not None and init.outputs:
        return tensor_ref(next(iter(init.outputs.values())).name)[0]
    for name in _INIT_COLLECTIONS:
        collection = graph_meta.collection_def.get(name)
        if collection is not None and collection.node_list.value:
            return tensor_ref(collection.node_list.value[0])[0]
    return None


def load_graph(path: Path) -> GraphServable:
    """Load the SavedModel at ``path`` for the graph runtime; ServingError (UNIMPLEMENTED) names the ops
    it cannot run, FAILED_PRECONDITION what else stops the load (unreadable variables ...)."""
    path = Path(path)
    try:
        graph_meta = meta_graph(read_saved_model(path))
    except SavedModelError as exc:
        raise ServingError(Code.NOT_FOUND, str(exc)) from None
    signatures = {name: from_signature_def(name, sig) for name, sig in graph_meta.signature_def.items()
                  if name != INIT_OP_SIGNATURE}
    graph = Graph(graph_meta.graph_def)
    saver = graph_meta.saver_def
    restore = saver.restore_op_name.split(":")[0] if saver.restore_op_name else None
    has_variables = (path / (str(VARIABLES) + ".index")).is_file()
    init = _init_op(graph_meta)
    load_roots = [key for key in ((restore if has_variables else None), init) if key]
    serving = [([tensor_ref(spec.tensor_name)[0] for spec in sig.outputs.values()],
                [tensor_ref(spec.tensor_name)[0] for spec in sig.inputs.values()]) for sig in signatures.values()]
    try:
        check_supported(graph, serving, load_roots)
        program = Program(graph)
        if restore and has_variables:
            prefix = np.array(str(path / VARIABLES).encode(), dtype=object)
            program.run_once([restore], {tensor_ref(saver.filename_tensor_name): prefix})
        if init:
            assets = {tensor_ref(a.tensor_info.name): np.array(str(path / ASSETS / a.filename).encode(), dtype=object)
                      for a in graph_meta.asset_file_def}
            program.run_once([init], assets)
    except (GraphError, OSError) as exc:
        raise ServingError(Code.FAILED_PRECONDITION, f"{path}: {exc}") from None
    except ServingError as exc:
        if exc.code == Code.UNIMPLEMENTED:
            raise ServingError(exc.code, f"{path}: {exc.message}") from None
        raise ServingError(exc.code, f"{path}: {exc.message}") from None
    except Exception as exc:  # the bundle reader's and kernels' own errors at load
        from modelyard.model.graph.bundle import BundleError

        if isinstance(exc, BundleError):
            raise ServingError(Code.DATA_LOSS, str(exc)) from None
        raise
    servable = GraphServable(path, program, signatures, graph_meta.signature_def)
    ops, weights = set(), 0
    for sig in signatures.values():  # compile the full output set now: a broken graph fails its load
        if sig.outputs:
            plan = servable.plan(sig, tuple(sig.outputs))
            ops.update(graph.node(key).op for key in plan.nodes)
            # What one request reads, not every restored variable: Keras 3's exports restore each weight twice.
            weights = max(weights, plan.weights)
    # A small dense model answers in tens of microseconds: cheaper on the event loop than a thread hop.
    servable.inline_ok = weights <= INLINE_WEIGHTS and not ops & HEAVY_OPS
    return servable
