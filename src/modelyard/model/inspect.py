"""What a model version holds, without loading it (``modelyard inspect``; flags in ``model/cli.py``).

Text output follows ``saved_model_cli show --all`` (tag-sets, SignatureDefs, tensor
dtypes, shapes and names, ops) so people and scripts used to it read it unchanged.
SavedModels are read as protos through ``modelyard.model.savedmodel``: no graph is
imported and no variable restored, so inspecting is safe on untrusted or broken
exports. ``model.tflite`` files are described through the LiteRT interpreter.
``saved_model_cli``'s "Concrete Functions" section is left out: it needs the
TF runtime to load the model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from modelyard.model.export import latest_version
from modelyard.model.savedmodel import SAVED_MODEL_FILES, TFLITE_FILE, SavedModelError, read_saved_model


class InspectError(Exception):
    """DIR cannot be inspected; the message says why."""


def _is_version_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in SAVED_MODEL_FILES + (TFLITE_FILE,))


def resolve(directory: str | Path) -> tuple[Path, int | None]:
    """``(version dir, version)``: DIR itself if it holds a model, else its latest version.

    ``version`` is None when DIR was given as a version directory.
    """
    path = Path(directory)
    if not path.is_dir():
        raise InspectError(f"{path} is not a directory")
    if _is_version_dir(path):
        return path, None
    latest = latest_version(path)
    if latest is None:
        raise InspectError(
            f"{path} holds no model: expected {' or '.join(SAVED_MODEL_FILES)} or {TFLITE_FILE} "
            "(a version directory), or integer-named version subdirectories (a model base path)"
        )
    return latest[1], latest[0]


def describe(directory: str | Path) -> dict[str, Any]:
    """Everything ``inspect`` shows, as JSON-ready data."""
    path, version = resolve(directory)
    info: dict[str, Any] = {"path": str(path), "version": version}
    if version is not None:
        info["base_path"] = str(Path(directory))
    has_saved_model = any((path / name).is_file() for name in SAVED_MODEL_FILES)
    if has_saved_model or not (path / TFLITE_FILE).is_file():
        try:
            info["tag_sets"] = _describe_saved_model(path)
        except SavedModelError as exc:
            raise InspectError(str(exc)) from exc
    if (path / TFLITE_FILE).is_file():
        info["tflite"] = _describe_tflite(path / TFLITE_FILE)
    return info


# --- SavedModel ---------------------------------------------------------------------------


def _dtype_name(dtype: int) -> str:
    from tensorflow.core.framework import types_pb2

    try:
        return types_pb2.DataType.Name(dtype)
    except ValueError:  # a dtype newer than this TF's enum
        return str(dtype)


def _tensor(tensor_info) -> dict[str, Any]:
    shape = tensor_info.tensor_shape
    return {
        "name": tensor_info.name,
        "dtype": _dtype_name(tensor_info.dtype),
        # None marks unknown rank, as distinct from a scalar's [].
        "shape": None if shape.unknown_rank else [dim.size for dim in shape.dim],
    }


def _ops(meta_graph_def) -> list[str]:
    # saved_model_cli's rule (meta_graph.ops_used_by_graph_def): ops of the graph and of
    # the library functions it reaches through (Stateful)PartitionedCall; a function's
    # name is not an op.
    graph = meta_graph_def.graph_def
    by_name = {f.signature.name: f for f in graph.library.function}
    used: set[str] = set()
    pending = []

    def use(op: str) -> None:
        if op not in used and op in by_name:
            pending.append(by_name[op])
        used.add(op)

    def visit(node) -> None:
        use(node.op)
        if node.op in ("PartitionedCall", "StatefulPartitionedCall"):
            use(node.attr["f"].func.name)

    for node in graph.node:
        visit(node)
    while pending:
        for node in pending.pop().node_def:
            visit(node)
    return sorted(used - by_name.keys())


def _describe_saved_model(path: Path) -> dict[str, Any]:
    saved_model = read_saved_model(path)
    tag_sets: dict[str, Any] = {}
    for mg in sorted(saved_model.meta_graphs, key=lambda mg: list(mg.meta_info_def.tags)):
        signatures = {}
        for key in sorted(mg.signature_def):
            sig = mg.signature_def[key]
            signatures[key] = {
                "method_name": sig.method_name,
                "inputs": {k: _tensor(sig.inputs[k]) for k in sorted(sig.inputs)},
                "outputs": {k: _tensor(sig.outputs[k]) for k in sorted(sig.outputs)},
            }
        tag_sets[", ".join(mg.meta_info_def.tags)] = {
            "tags": list(mg.meta_info_def.tags),
            "signatures": signatures,
            "ops": _ops(mg),
        }
    return tag_sets


# --- TFLite -------------------------------------------------------------------------------


def _tflite_tensor(detail: dict[str, Any]) -> dict[str, Any]:
    scale, zero_point = detail.get("quantization", (0.0, 0))
    return {
        "name": detail["name"],
        "index": int(detail["index"]),
        "dtype": detail["dtype"].__name__,
        "shape": [int(d) for d in detail["shape"]],
        # -1 marks a dimension resizable at run time (e.g. the batch).
        "shape_signature": [int(d) for d in detail.get("shape_signature", detail["shape"])],
        "quantization": {"scale": float(scale), "zero_point": int(zero_point)},
    }


def _describe_tflite(model_file: Path) -> dict[str, Any]:
    from ai_edge_litert.interpreter import Interpreter

    try:
        interpreter = Interpreter(model_path=str(model_file))
    except (ValueError, RuntimeError) as exc:
        raise InspectError(f"{model_file} is not a valid TFLite model: {exc}") from exc
    return {
        "path": str(model_file),
        "inputs": [_tflite_tensor(d) for d in interpreter.get_input_details()],
        "outputs": [_tflite_tensor(d) for d in interpreter.get_output_details()],
        "signatures": interpreter.get_signature_list(),
    }


# --- text ---------------------------------------------------------------------------------


def _shape_text(shape: list[int] | None) -> str:
    return "unknown_rank" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"


def format_text(info: dict[str, Any]) -> str:
    """``saved_model_cli show --all``'s layout for SavedModels; the same spirit for TFLite."""
    lines: list[str] = []
    if info["version"] is not None:
        lines.append(
            f"{info['base_path']} is a model base path; showing its latest version "
            f"{info['version']} ({info['path']})"
        )
    for tag_set, meta in info.get("tag_sets", {}).items():
        lines += ["", f"MetaGraphDef with tag-set: '{tag_set}' contains the following SignatureDefs:"]
        for key, sig in meta["signatures"].items():
            lines += ["", f"signature_def['{key}']:"]
            for kind, label in (("inputs", "input(s)"), ("outputs", "output(s)")):
                lines.append(f"  The given SavedModel SignatureDef contains the following {label}:")
                for name, tensor in sig[kind].items():
                    lines += [
                        f"    {kind}['{name}'] tensor_info:",
                        f"        dtype: {tensor['dtype']}",
                        f"        shape: {_shape_text(tensor['shape'])}",
                        f"        name: {tensor['name']}",
                    ]
            lines.append(f"  Method name is: {sig['method_name']}")
        ops = "{" + ", ".join(repr(op) for op in meta["ops"]) + "}"
        lines.append(f"The MetaGraph with tag set {meta['tags']} contains the following ops: {ops}")
    if "tflite" in info:
        tflite = info["tflite"]
        lines += ["", f"TFLite model: {tflite['path']}"]
        for kind, label in (("inputs", "input(s)"), ("outputs", "output(s)")):
            lines.append(f"  The TFLite model contains the following {label}:")
            for tensor in tflite[kind]:
                q = tensor["quantization"]
                lines += [
                    f"    {kind}['{tensor['name']}'] (tensor index {tensor['index']}):",
                    f"        dtype: {tensor['dtype']}",
                    f"        shape: {_shape_text(tensor['shape'])}",
                    f"        shape_signature: {_shape_text(tensor['shape_signature'])}",
                    f"        quantization: scale={q['scale']} zero_point={q['zero_point']}",
                ]
        for key, sig in tflite["signatures"].items():
            lines.append(
                f"  signature['{key}']: inputs {sig.get('inputs', [])}, outputs {sig.get('outputs', [])}"
            )
    return "\n".join(lines) + "\n"
