"""Reading SavedModel directories without loading TensorFlow's runtime.

One place for: where a version's graph lives, which MetaGraph a tag-set selects,
and the signatures it holds. Used by ``inspect``, the server's metadata and loaders.
"""
from __future__ import annotations

from pathlib import Path

SERVE_TAG = "serve"
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
TFLITE_FILE = "model.tflite"


class SavedModelError(Exception):
    """The directory is not a readable SavedModel; the message says why and what to do."""


def saved_model_file(export_dir: str | Path) -> Path:
    export_dir = Path(export_dir)
    for name in SAVED_MODEL_FILES:
        candidate = export_dir / name
        if candidate.is_file():
            return candidate
    raise SavedModelError(
        f"Could not find SavedModel .pb or .pbtxt at supplied export directory path: {export_dir}"
    )


def read_saved_model(export_dir: str | Path):
    """Parse ``saved_model.pb`` (or ``.pbtxt``) into a ``saved_model_pb2.SavedModel``."""
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    path = saved_model_file(export_dir)
    proto = saved_model_pb2.SavedModel()
    try:
        if path.suffix == ".pbtxt":
            text_format.Parse(path.read_text(), proto)
        else:
            proto.ParseFromString(path.read_bytes())
    except (message.DecodeError, text_format.ParseError) as exc:
        raise SavedModelError(f"{path} is not a valid SavedModel: {exc}") from exc
    return proto


def tag_sets(saved_model) -> list[list[str]]:
    return [list(mg.meta_info_def.tags) for mg in saved_model.meta_graphs]


def meta_graph(saved_model, tags: tuple[str, ...] = (SERVE_TAG,)):
    """The MetaGraphDef whose tag-set equals ``tags`` (TF Serving loads the 'serve' one)."""
    wanted = set(tags)
    for mg in saved_model.meta_graphs:
        if set(mg.meta_info_def.tags) == wanted:
            return mg
    available = "; ".join(",".join(t) for t in tag_sets(saved_model)) or "none"
    raise SavedModelError(
        f"MetaGraphDef associated with tags {{{', '.join(sorted(wanted))}}} could not be found in "
        f"SavedModel. Available tag-sets: {available}"
    )


def is_tf1_export(export_dir: str | Path) -> bool:
    """True for graph-mode (TF1) exports: no TF2 object graph, often reference variables."""
    return len(meta_graph(read_saved_model(export_dir)).object_graph_def.nodes) == 0
