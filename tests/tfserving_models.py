"""Test-time equivalents of TF Serving's half_plus_two test models, so a plain clone's tests run.

TF Serving's own test models (``../shared/testdata/tfserving``, see its README) are not part
of this repository. ``write_tfserving_models(root)`` builds models that stand in for them,
made the way TF Serving's generators make theirs, into the same layout:

- ``saved_model_half_plus_two_cpu/00000123``: a TF1 graph-mode export (``tf.compat.v1``
  SavedModelBuilder) with reference variables (``VariableV2``) a=0.5, b=2, c=3, a2=0.5,
  c2=3, an asset ``foo.txt`` assigned by the main op, and predict, classify and regress
  signatures: ``y = a*x + b``, ``y2 = a*x + c``, ``y3 = a2*x2 + c2``.
- ``saved_model_half_plus_two_tf2_cpu/00000123``: the same function saved by TF2
  (``tf.saved_model.save`` of a ``tf.Module``), every signature with the predict method.
- ``saved_model_half_plus_two_tflite/00000123/model.tflite``: ``y = a*x + b`` on a [1, 1]
  input, converted from a TF1 session.
- ``bad_half_plus_two/00000123``: a pre-SavedModel session-bundle export (checkpoint +
  ``export.meta``, no ``saved_model.pb``), which must fail to load with a clear reason.
- ``half_plus_two_model_metadata.json``: TF Serving's REST metadata answer for the TF1
  model served as ``default``, version 123 (rendered from ``TF1_SIGNATURES``).
- ``monitoring_config.txt``: a MonitoringConfig enabling Prometheus.

Where the shared folder exists, ``tests/test_tfserving_generated.py`` proves the TF1 model
and its metadata file match TF Serving's. ``shared_testdata()`` is the one place that says
where TF Serving's own files are (``MODELYARD_TFSERVING_TESTDATA`` overrides it, e.g. to a
missing path to run as a plain clone would).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

VERSION = "00000123"
ASSET_NAME = "foo.txt"
ASSET_TEXT = "asset-file-contents"
PREDICT, CLASSIFY, REGRESS = (f"tensorflow/serving/{m}" for m in ("predict", "classify", "regress"))
MONITORING_CONFIG = 'prometheus_config: {\n  enable: true,\n  path: "/monitoring/prometheus/metrics"\n}\n'

# Where TF Serving's own test models sit: next to the repository root, <root>/../shared/testdata.
DEFAULT_SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "testdata" / "tfserving"
ENV_OVERRIDE = "MODELYARD_TFSERVING_TESTDATA"

# The TF1 model's signatures: key -> (method, inputs, outputs); a tensor is
# (tensor name, dtype, shape or None for unknown rank). The export looks its tensors up here,
# and the expected metadata JSON is rendered from here.
_BATCH_1 = (-1, 1)
TF1_SIGNATURES: dict[str, tuple[str, dict, dict]] = {
    "serving_default": (PREDICT, {"x": ("x:0", "DT_FLOAT", _BATCH_1)}, {"y": ("y:0", "DT_FLOAT", _BATCH_1)}),
    "classify_x_to_y": (CLASSIFY, {"inputs": ("tf_example:0", "DT_STRING", None)},
                        {"scores": ("y:0", "DT_FLOAT", _BATCH_1)}),
    "regress_x_to_y": (REGRESS, {"inputs": ("tf_example:0", "DT_STRING", None)},
                       {"outputs": ("y:0", "DT_FLOAT", _BATCH_1)}),
    "regress_x_to_y2": (REGRESS, {"inputs": ("tf_example:0", "DT_STRING", None)},
                        {"outputs": ("y2:0", "DT_FLOAT", _BATCH_1)}),
    "regress_x2_to_y3": (REGRESS, {"inputs": ("x2:0", "DT_FLOAT", _BATCH_1)},
                         {"outputs": ("y3:0", "DT_FLOAT", _BATCH_1)}),
}


def shared_testdata() -> Path | None:
    """TF Serving's own test models folder, or None when it is absent (a plain clone)."""
    path = Path(os.environ.get(ENV_OVERRIDE) or DEFAULT_SHARED).resolve()
    return path if path.is_dir() else None


def configured_shared_path() -> Path:
    """The path looked at for TF Serving's own test models, whether or not it exists."""
    return Path(os.environ.get(ENV_OVERRIDE) or DEFAULT_SHARED)


def write_tfserving_models(root: Path) -> Path:
    """Write every stand-in model and file into ``root`` (TF Serving's testdata layout); return it."""
    root.mkdir(parents=True, exist_ok=True)
    _write_tf1(root / "saved_model_half_plus_two_cpu" / VERSION)
    _write_tf2(root / "saved_model_half_plus_two_tf2_cpu" / VERSION)
    tflite_dir = root / "saved_model_half_plus_two_tflite" / VERSION
    tflite_dir.mkdir(parents=True)
    (tflite_dir / "model.tflite").write_bytes(_tflite_bytes())
    _write_bad(root / "bad_half_plus_two" / VERSION)
    metadata = expected_metadata("default", int(VERSION))
    (root / "half_plus_two_model_metadata.json").write_text(json.dumps(metadata, indent=1))
    (root / "monitoring_config.txt").write_text(MONITORING_CONFIG)
    return root


def expected_metadata(model_name: str, version: int) -> dict:
    """TF Serving's ``GET /v1/models/<name>/metadata`` answer for the TF1 model, in its JSON form."""
    def tensor(name: str, dtype: str, shape) -> dict:
        dims = [] if shape is None else [{"size": str(size), "name": ""} for size in shape]
        return {"dtype": dtype, "tensor_shape": {"dim": dims, "unknown_rank": shape is None}, "name": name}

    signatures = {
        key: {
            "inputs": {k: tensor(*t) for k, t in inputs.items()},
            "outputs": {k: tensor(*t) for k, t in outputs.items()},
            "method_name": method,
            "defaults": {},
        }
        for key, (method, inputs, outputs) in TF1_SIGNATURES.items()
    }
    return {
        "model_spec": {"name": model_name, "signature_name": "", "version": str(version)},
        "metadata": {"signature_def": {"signature_def": signatures}},
    }


def _half_plus_two_graph(tf1, with_examples: bool):
    """Build the TF1 graph's variables and tensors in the current default graph."""
    def ref_variable(value, name):  # VariableV2, as TF 1.x exported: not a resource variable
        return tf1.Variable(value, name=name, use_resource=False)

    a, b, c = ref_variable(0.5, "a"), ref_variable(2.0, "b"), ref_variable(3.0, "c")
    if not with_examples:  # the TFLite model's fixed [1, 1] float input
        x = tf1.placeholder(tf1.float32, shape=[1, 1], name="x")
        return x, tf1.identity(tf1.raw_ops.Add(x=a * x, y=b), name="y")
    serialized = tf1.placeholder(tf1.string, name="tf_example")
    # The first ParseExample op (TF 1.x's): its dense outputs keep their static [-1, 1] shape,
    # which the signatures show; ParseExampleV2 leaves them of unknown rank. "x" is required
    # (an empty default), "x2" defaults to 0.
    # Its node is ParseExample/ParseExample, as tf.parse_example named it (errors quote the name).
    with tf1.name_scope("ParseExample"):
        no_default = tf1.constant([], tf1.float32)
        features = dict(zip(("x", "x2"), tf1.raw_ops.ParseExample(
            serialized=serialized, names=tf1.constant([], tf1.string), sparse_keys=[],
            dense_keys=[tf1.constant("x"), tf1.constant("x2")],
            dense_defaults=[no_default, tf1.constant([0.0])], sparse_types=[], dense_shapes=[[1], [1]],
            name="ParseExample",
        ).dense_values))
    x = tf1.identity(features["x"], name="x")
    tf1.identity(tf1.raw_ops.Add(x=a * x, y=b), name="y")
    tf1.identity(tf1.raw_ops.Add(x=a * x, y=c), name="y2")
    x2 = tf1.identity(features["x2"], name="x2")
    a2, c2 = ref_variable(0.5, "a2"), ref_variable(3.0, "c2")
    tf1.identity(tf1.raw_ops.Add(x=a2 * x2, y=c2), name="y3")
    return x, None


def _write_tf1(export_dir: Path) -> None:
    import tensorflow as tf

    tf1 = tf.compat.v1
    with tempfile.TemporaryDirectory() as original, tf.Graph().as_default() as graph:
        _half_plus_two_graph(tf1, with_examples=True)
        # The asset: a file path constant in ASSET_FILEPATHS, copied into assets/ by the builder,
        # and a string variable the main op assigns, as TF Serving's generator does.
        source = Path(original) / ASSET_NAME
        source.write_text(ASSET_TEXT)
        tf1.add_to_collection(tf1.GraphKeys.ASSET_FILEPATHS, tf1.constant(str(source)))
        filename = tf1.Variable(ASSET_NAME, name="filename_tensor", trainable=False, collections=[],
                                use_resource=False)
        main_op = tf1.group(filename.assign(ASSET_NAME))
        signature_defs = {
            key: tf1.saved_model.signature_def_utils.build_signature_def(
                {k: tf1.saved_model.utils.build_tensor_info(graph.get_tensor_by_name(t[0]))
                 for k, t in inputs.items()},
                {k: tf1.saved_model.utils.build_tensor_info(graph.get_tensor_by_name(t[0]))
                 for k, t in outputs.items()},
                method,
            )
            for key, (method, inputs, outputs) in TF1_SIGNATURES.items()
        }
        with tf1.Session(graph=graph) as sess:
            sess.run(tf1.global_variables_initializer())
            builder = tf1.saved_model.Builder(str(export_dir))
            builder.add_meta_graph_and_variables(
                sess, [tf1.saved_model.tag_constants.SERVING], signature_def_map=signature_defs,
                assets_collection=tf1.get_collection(tf1.GraphKeys.ASSET_FILEPATHS), main_op=main_op,
            )
            builder.save()


def _write_tf2(export_dir: Path) -> None:
    import tensorflow as tf

    def parse(serialized, key):
        spec = {key: tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0] if key == "x2" else None)}
        return tf.io.parse_example(serialized, spec)[key]

    examples = tf.TensorSpec([None], tf.string, name="inputs")
    one_float = tf.TensorSpec([1], tf.float32, name="inputs")

    class HalfPlusTwo(tf.Module):
        """TF2's half_plus_two: one function per signature, all with the predict method."""

        def __init__(self, asset_path: str):
            super().__init__()
            self.a, self.b, self.c = (tf.Variable(v, name=n) for v, n in ((0.5, "a"), (2.0, "b"), (3.0, "c")))
            self.asset = tf.saved_model.Asset(asset_path)

        @tf.function(input_signature=[tf.TensorSpec([1], tf.float32)])
        def predict(self, x=tf.constant([0.0])):
            return {"y": self.a * x + self.b}

        @tf.function(input_signature=[examples])
        def regress_xy(self, serialized_proto):
            return {"outputs": self.a * parse(serialized_proto, "x") + self.b}

        @tf.function(input_signature=[examples])
        def regress_xy2(self, serialized_proto):
            return {"outputs": self.a * parse(serialized_proto, "x") + self.c}

        @tf.function(input_signature=[one_float])
        def regress_x2y3(self, x2):
            return {"outputs": self.a * x2 + self.c}

        @tf.function(input_signature=[examples])
        def classify_xy(self, serialized_proto):
            return {"scores": self.a * parse(serialized_proto, "x") + self.b}

        @tf.function(input_signature=[one_float])
        def classify_x2y3(self, x2):
            return {"scores": self.a * x2 + self.c}

    with tempfile.TemporaryDirectory() as original:
        source = Path(original) / ASSET_NAME
        source.write_text(ASSET_TEXT)
        model = HalfPlusTwo(str(source))
        signatures = {
            "serving_default": model.predict, "regress_x_to_y": model.regress_xy,
            "regress_x_to_y2": model.regress_xy2, "regress_x2_to_y3": model.regress_x2y3,
            "classify_x_to_y": model.classify_xy, "classify_x2_to_y3": model.classify_x2y3,
        }
        tf.saved_model.save(model, str(export_dir), signatures=signatures)


def _tflite_bytes() -> bytes:
    """``y = 0.5x + 2`` on a [1, 1] input, converted from a TF1 session holding reference variables."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        x, y = _half_plus_two_graph(tf1, with_examples=False)
        with tf1.Session(graph=graph) as sess:
            sess.run(tf1.global_variables_initializer())
            return tf1.lite.TFLiteConverter.from_session(sess, [x], [y]).convert()


def _write_bad(export_dir: Path) -> None:
    """A session-bundle export (TF Serving's format before SavedModel): no saved_model.pb in it."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    export_dir.mkdir(parents=True)
    with tf.Graph().as_default() as graph:
        tf1.Variable(0.5, use_resource=False)
        tf1.Variable(2.0, use_resource=False)
        with tf1.Session(graph=graph) as sess:
            sess.run(tf1.global_variables_initializer())
            # Checkpoint format V1 writes one ``export`` file, as that exporter did.
            saver = tf1.train.Saver(write_version=tf1.train.SaverDef.V1)
            saver.save(sess, str(export_dir / "export"), meta_graph_suffix="meta", write_meta_graph=True)
