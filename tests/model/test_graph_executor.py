"""The graph runtime (modelyard.model.graph): SavedModels exported by Keras run without TensorFlow and
answer what TensorFlow answers.

Models are built and exported once per module with TensorFlow here (Keras 3's ``model.export``;
``tf.saved_model.save`` of a tf_keras model, whose batch norm is the fused op, and of a ``tf.Module``), TensorFlow's answers taken through
``modelyard serve``'s session path; then one fresh process whose ``tensorflow`` package holds only the
message modules (``messages_only``, as the slim image) loads every model through ``cached_servable``
and answers the same inputs. Errors and kernels are checked in this process, one layer down.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from modelyard.errors import Code, ServingError
from modelyard.model.runtime import inference

SRC = Path(__file__).resolve().parents[2] / "src"
BATCH = 3


def _build(root: Path) -> dict:
    """Export the test models under ``root``; returns {name: {"inputs": {alias: array}}}."""
    import keras
    import tensorflow as tf
    import tf_keras

    rng = np.random.default_rng(7)
    made = {}

    # The textbook's MNIST model (Flatten, Dense relu, Dense softmax), exported as its notebook does.
    mlp = keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(30, activation="relu"),
                            keras.layers.Dense(10, activation="softmax")])
    mlp.export(str(root / "mlp"), verbose=False)
    made["mlp"] = {"keras_tensor": rng.normal(size=(BATCH, 28, 28)).astype(np.float32)}

    # A small CNN: convolutions (SAME/VALID, strides, depthwise), batch norm with trained-looking
    # statistics, max and average pooling.
    def cnn_layers(layers):
        return [layers.Conv2D(4, 3, padding="same", activation="relu"), layers.BatchNormalization(),
                layers.DepthwiseConv2D(3, depth_multiplier=2, padding="valid"), layers.MaxPooling2D(2),
                layers.Conv2D(4, 3, strides=2, padding="same", activation="relu6"),
                layers.AveragePooling2D(2, padding="same"), layers.GlobalAveragePooling2D(),
                layers.Dense(3, activation="softmax")]

    def randomize_batch_norm(model):
        for layer in model.layers:
            if "batch_normalization" in layer.name:
                layer.set_weights([rng.uniform(0.5, 1.5, w.shape).astype(np.float32) if i in (0, 3)
                                   else rng.normal(size=w.shape).astype(np.float32)
                                   for i, w in enumerate(layer.get_weights())])

    cnn = keras.Sequential([keras.Input((12, 12, 3))] + cnn_layers(keras.layers))
    randomize_batch_norm(cnn)
    cnn.export(str(root / "cnn"), verbose=False)
    made["cnn"] = {"keras_tensor": rng.normal(size=(BATCH, 12, 12, 3)).astype(np.float32)}
    fused = tf_keras.Sequential([tf_keras.Input((12, 12, 3), name="image")] + cnn_layers(tf_keras.layers))
    randomize_batch_norm(fused)
    tf.saved_model.save(fused, str(root / "cnn_tf_keras"))  # tf_keras' batch norm is FusedBatchNormV3
    made["cnn_tf_keras"] = {"image": rng.normal(size=(BATCH, 12, 12, 3)).astype(np.float32)}

    # A text model: token ids through an embedding and average pooling.
    text = keras.Sequential([keras.Input((8,), dtype="int32"), keras.layers.Embedding(50, 6),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(4, activation="sigmoid")])
    text.export(str(root / "text"), verbose=False)
    made["text"] = {"keras_tensor": rng.integers(0, 50, size=(BATCH, 8)).astype(np.int32)}

    # Preprocessing layers in the model: raw uint8 pixels rescaled, features normalized; two inputs,
    # two outputs, gelu (Erf) and tanh.
    pixels = keras.Input((5,), dtype="uint8", name="pixels")
    features = keras.Input((3,), name="features")
    normalize = keras.layers.Normalization()
    normalize.adapt(rng.normal(3.0, 2.0, size=(64, 3)).astype(np.float32))
    joined = keras.layers.Concatenate()([keras.layers.Rescaling(1 / 255, offset=-0.5)(pixels), normalize(features)])
    hidden = keras.layers.Dense(8, activation="gelu")(joined)
    pre = keras.Model([pixels, features], [keras.layers.Dense(2, activation="softmax", name="probs")(hidden),
                                           keras.layers.Dense(1, activation="tanh", name="score")(hidden)])
    pre.export(str(root / "preprocessing"), verbose=False)
    made["preprocessing"] = {"pixels": rng.integers(0, 256, size=(BATCH, 5)).astype(np.uint8),
                             "features": rng.normal(3.0, 2.0, size=(BATCH, 3)).astype(np.float32)}

    # An op the graph runtime has no kernel for.
    class Cumulative(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.math.cumsum(x, axis=1)}

    module = Cumulative()
    tf.saved_model.save(module, str(root / "cumsum"), signatures={"serving_default": module.serve})
    return made


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(root, {model: inputs}, {model: TensorFlow's outputs}) for the models above."""
    from modelyard.model.runtime.tf_session import load_saved_model

    root = tmp_path_factory.mktemp("graph_models")
    made = _build(root)
    expected = {}
    for name, inputs in made.items():
        session = load_saved_model(root / name)
        try:
            aliases = session.signatures["serving_default"].inputs
            if len(inputs) == 1 and len(aliases) == 1:  # Keras numbers its input names per process
                inputs = {next(iter(aliases)): next(iter(inputs.values()))}
            made[name] = inputs
            expected[name] = inference.run_predict(session, "", inputs)[1]
        finally:
            session.close()
        np.savez(root / f"{name}.inputs.npz", **inputs)
    return root, made, expected


# In a process where TensorFlow's runtime cannot be imported: every model through the loader's entry point.
_NO_TENSORFLOW = r"""
import json, sys
for blocked in ("keras", "tf_keras", "ai_edge_litert", "tensorboard"):
    sys.modules[blocked] = None
from pathlib import Path
import numpy as np
from modelyard.errors import ServingError
from modelyard.model.runtime import inference
from modelyard.model.runtime.choose_runtime import cached_servable, tensorflow_installed

root, names = Path(sys.argv[1]), sys.argv[2].split(",")
said = {"tensorflow_installed": tensorflow_installed(), "runtimes": {}, "refused": {}}
for name in names:
    try:
        servable = cached_servable(root / name, "auto")
    except ServingError as exc:
        said["refused"][name] = [exc.code.name, exc.message]
        continue
    said["runtimes"][name] = servable.runtime
    inputs = dict(np.load(root / f"{name}.inputs.npz"))
    _, out = inference.run_predict(servable, "", inputs)
    np.savez(root / f"{name}.graph.npz", **out)
said["tensorflow_runtime_loaded"] = any(m.startswith("tensorflow.python") for m in sys.modules)
print(json.dumps(said))
"""


def test_keras_exports_answer_as_tensorflow_in_a_process_without_tensorflow(exported, tmp_path):
    root, made, expected = exported
    messages = tmp_path / "site"
    from modelyard.model.graph import messages_only

    import importlib.util

    messages_only.write(Path(importlib.util.find_spec("tensorflow").submodule_search_locations[0]), messages)
    env = {"PYTHONPATH": os.pathsep.join([str(messages), str(SRC)]), "PATH": os.environ.get("PATH", "/usr/bin")}
    done = subprocess.run([sys.executable, "-c", _NO_TENSORFLOW, str(root), ",".join([*made, "cumsum"])], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["tensorflow_installed"] is False and said["tensorflow_runtime_loaded"] is False
    code, message = said["refused"].pop("cumsum")
    assert code == "UNIMPLEMENTED" and "Cumsum" in message and "modelyard-serving:full" in message, message
    assert said["refused"] == {}
    assert said["runtimes"] == {name: "graph" for name in made if name != "cumsum"}
    for name in said["runtimes"]:
        got = dict(np.load(root / f"{name}.graph.npz"))
        assert set(got) == set(expected[name]), name
        for alias, want in expected[name].items():
            assert got[alias].dtype == want.dtype and got[alias].shape == want.shape, (name, alias)
            np.testing.assert_allclose(got[alias], want, rtol=1e-5, atol=1e-6, err_msg=f"{name} {alias}")


@pytest.fixture(scope="module")
def mlp(exported):
    from modelyard.model.runtime.graph_servable import load_graph
    from modelyard.model.runtime.tf_session import load_saved_model

    root = exported[0]
    session = load_saved_model(root / "mlp")
    yield load_graph(root / "mlp"), session
    session.close()


def _error(servable, inputs) -> ServingError:
    with pytest.raises(ServingError) as caught:
        inference.run_predict(servable, "", inputs)
    return caught.value


@pytest.mark.parametrize("value", [np.zeros((2, 28, 28), np.float64), np.zeros((2, 28, 28), np.int32)],
                         ids=["float64", "int32"])
def test_a_wrong_dtype_gets_the_tensorflow_paths_error(mlp, value):
    graph, session = mlp
    alias = next(iter(session.signatures["serving_default"].inputs))
    want = _error(session, {alias: value})
    got = _error(graph, {alias: value})
    assert (got.code, got.message) == (want.code, want.message) and got.code == Code.INVALID_ARGUMENT


@pytest.mark.parametrize("shape", [(2, 27, 28), (2, 28), (2, 28, 28, 1, 2)])
def test_a_wrong_shape_gets_the_tensorflow_paths_error(mlp, shape):
    graph, session = mlp
    value = np.zeros(shape, np.float32)
    alias = next(iter(session.signatures["serving_default"].inputs))
    want = _error(session, {alias: value})
    got = _error(graph, {alias: value})
    assert (got.code, got.message) == (want.code, want.message) and "has shape" in got.message


def test_metadata_is_the_meta_graphs_signature_defs(mlp):
    graph, session = mlp
    assert dict(graph.signature_def_map) == dict(session.signature_def_map)
    assert graph.signatures == session.signatures


def test_a_dense_model_runs_fused_and_inline_a_convolutional_one_on_threads(mlp, exported):
    from modelyard.model.runtime.graph_servable import load_graph

    graph, _session = mlp
    plan = graph.plan(graph.signatures["serving_default"], ("output_0",))
    # Flatten's shape arithmetic, its Reshape, then both Dense layers (MatMul, BiasAdd, activation) in one step.
    assert len(plan.nodes) == 10 and len(plan.steps) == 3
    # The weights one request reads, each once (Keras 3's export restores every variable twice).
    assert plan.weights == 28 * 28 * 30 + 30 + 30 * 10 + 10 + 3 + 1 and graph.inline_ok
    cnn = load_graph(exported[0] / "cnn")
    assert not cnn.inline_ok  # its Conv2D is inside a fused step: still seen


def test_a_corrupted_checkpoint_is_refused_at_load(exported, tmp_path):
    from modelyard.model.runtime.graph_servable import load_graph

    copy = tmp_path / "mlp"
    shutil.copytree(exported[0] / "mlp", copy)
    data = next((copy / "variables").glob("variables.data-*"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(ServingError) as caught:
        load_graph(copy)
    assert caught.value.code == Code.DATA_LOSS and "CRC32C" in caught.value.message


def test_an_unsupported_op_is_refused_at_load_by_name(exported):
    from modelyard.model.runtime.graph_servable import load_graph

    with pytest.raises(ServingError) as caught:
        load_graph(exported[0] / "cumsum")
    assert caught.value.code == Code.UNIMPLEMENTED
    assert "Cumsum" in caught.value.message and "modelyard-serving:full" in caught.value.message


def test_string_entries_of_the_checkpoint_read_with_their_crc(exported):
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    from modelyard.model.graph.bundle import Bundle

    bundle = Bundle(exported[0] / "mlp" / "variables" / "variables")
    graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(
        bundle.tensor("_CHECKPOINTABLE_OBJECT_GRAPH").item())
    assert any(a.name == "VARIABLE_VALUE" for node in graph.nodes for a in node.attributes)


# ---- kernels one by one, against TensorFlow's own ops -------------------------------------------
def _kernel(op: str, **attrs):
    import tensorflow as tf

    from modelyard.model.graph.ops import KERNELS, Attrs

    node = tf.compat.v1.NodeDef(op=op, name=op)
    for name, value in attrs.items():
        if isinstance(value, bool):
            node.attr[name].b = value
        elif isinstance(value, int):
            node.attr[name].i = value
        elif isinstance(value, bytes):
            node.attr[name].s = value
        elif isinstance(value, float):
            node.attr[name].f = value
        else:
            node.attr[name].list.i.extend(value)
    return KERNELS[op](Attrs(node.attr, op, op), None)


@pytest.mark.parametrize("padding,strides,dilations", [(b"SAME", 1, 1), (b"VALID", 2, 1), (b"SAME", 2, 1),
                                                        (b"SAME", 1, 2)])
def test_conv2d_and_pools_match_tensorflow(padding, strides, dilations):
    import tensorflow as tf

    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 9, 8, 3)).astype(np.float32)
    f = rng.normal(size=(3, 2, 3, 4)).astype(np.float32)
    s, d = [1, strides, strides, 1], [1, dilations, dilations, 1]
    conv = _kernel("Conv2D", padding=padding, strides=s, dilations=d)(x, f)[0]
    want = tf.raw_ops.Conv2D(input=x, filter=f, strides=s, padding=padding.decode(), dilations=d).numpy()
    np.testing.assert_allclose(conv, want, rtol=1e-5, atol=1e-5)
    dw = rng.normal(size=(3, 3, 3, 2)).astype(np.float32)
    got = _kernel("DepthwiseConv2dNative", padding=padding, strides=s, dilations=d)(x, dw)[0]
    want = tf.raw_ops.DepthwiseConv2dNative(input=x, filter=dw, strides=s, padding=padding.decode(),
                                            dilations=d).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    k = [1, 3, 2, 1]
    for op in ("MaxPool", "AvgPool"):
        got = _kernel(op, ksize=k, strides=s, padding=padding)(x)[0]
        arg = {"MaxPool": "input", "AvgPool": "value"}[op]
        want = getattr(tf.raw_ops, op)(**{arg: x}, ksize=k, strides=s, padding=padding.decode()).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=op)


@pytest.mark.parametrize("masks", [dict(), dict(begin_mask=1, end_mask=2), dict(shrink_axis_mask=1),
                                   dict(ellipsis_mask=1), dict(new_axis_mask=2, end_mask=1)],
                         ids=["plain", "begin-end", "shrink", "ellipsis", "new-axis"])
def test_strided_slice_matches_tensorflow(masks):
    import tensorflow as tf

    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    begin, end, strides = np.array([1, -3, 0]), np.array([3, 4, 5]), np.array([1, 2, 2])
    got = _kernel("StridedSlice", **masks)(x, begin, end, strides)[0]
    want = tf.raw_ops.StridedSlice(input=x, begin=begin, end=end, strides=strides, **masks).numpy()
    assert got.shape == want.shape and np.array_equal(got, want)


def test_gather_refuses_an_index_out_of_range():
    gather = _kernel("GatherV2")
    params = np.arange(10, dtype=np.float32)
    assert np.array_equal(gather(params, np.array([[1, 9]]), np.int32(0))[0], [[1, 9]])
    for bad in (10, -1):
        with pytest.raises(ServingError) as caught:
            gather(params, np.array([0, bad]), np.int32(0))
        assert caught.value.code == Code.INVALID_ARGUMENT and f"{bad} is not in [0, 10)" in caught.value.message


def test_constants_decode_as_tensorflow_decodes_them():
    import tensorflow as tf

    from modelyard.model.graph.ops import tensor_value

    for value in (np.float32(2.5), np.arange(6, dtype=np.int64).reshape(2, 3), np.array([b"a", b"bc"], dtype=object),
                  np.array([1.5, -2], np.float16), np.array([True, False]), np.zeros((2, 0), np.float32)):
        proto = tf.make_tensor_proto(value)
        got, want = tensor_value(proto), tf.make_ndarray(proto)
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    compact = tf.make_tensor_proto(7.0, dtype=tf.float32, shape=[2, 2])  # one value for the whole shape
    assert np.array_equal(tensor_value(compact), tf.make_ndarray(compact))


def test_tf1_half_plus_two_reference_variables_and_parsed_examples(generated_tfserving):
    """TF Serving's TF1 test model (VariableV2 restored by save/restore_all, the main op's Assign, ParseExample
    for classify and regress): every signature answers what the TensorFlow session answers."""
    from tensorflow.core.example import example_pb2

    from modelyard.model.runtime.graph_servable import load_graph
    from modelyard.model.runtime.tf_session import load_saved_model

    path = generated_tfserving / "saved_model_half_plus_two_cpu" / "00000123"
    graph, session = load_graph(path), load_saved_model(path)
    try:
        x = np.array([[1.0], [2.0], [-4.0]], np.float32)
        assert np.array_equal(inference.run_predict(graph, "", {"x": x})[1]["y"],
                              inference.run_predict(session, "", {"x": x})[1]["y"])
        examples = []
        for value in (1.0, 2.0):
            example = example_pb2.Example()
            example.features.feature["x"].float_list.value.append(value)
            examples.append(example.SerializeToString())
        for name in ("regress_x_to_y", "regress_x_to_y2"):
            got = inference.run_regress(graph, name, examples)[1]
            assert np.array_equal(got, inference.run_regress(session, name, examples)[1]), name
        got = inference.run_classify(graph, "classify_x_to_y", examples)[1]
        assert np.array_equal(got.scores, inference.run_classify(session, "classify_x_to_y", examples)[1].scores)
        assert np.array_equal(got.scores, [[2.5], [3.0]])
    finally:
        session.close()


def test_tfrecords_read_as_tensorflow_writes_them(tmp_path):
    """The warmup file's format (assets.extra/tf_serving_warmup_requests) without TensorFlow; damage is refused."""
    import tensorflow as tf

    from modelyard.model.graph.tfrecord import TFRecordError, records

    path = tmp_path / "warmup"
    written = [b"", b"one", bytes(range(256)) * 40]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in written:
            writer.write(record)
    assert list(records(path)) == written
    raw = bytearray(path.read_bytes())
    raw[-20] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(TFRecordError, match="corrupted record"):
        list(records(path))
    path.write_bytes(bytes(raw[:-3]))
    with pytest.raises(TFRecordError, match="truncated record"):
        list(records(path))


# ---- the dense layers' C kernel (model.graph.native, _densechain) -------------------------------------
def test_small_batches_of_a_dense_model_run_in_c_and_answer_as_the_numpy_kernels(exported, monkeypatch):
    from modelyard.model.graph import native
    from modelyard.model.runtime.graph_servable import load_graph

    root, made, _expected = exported
    with_c = load_graph(root / "mlp")
    plan = with_c.plan(with_c.signatures["serving_default"], ("output_0",))
    head = plan.steps[-1][0].head  # the Dense layers' step: both layers in C
    assert head[1:] == (2, 28 * 28, False)
    c_kernel = native._densechain
    monkeypatch.setattr(native, "_densechain", None)
    numpy_only = load_graph(root / "mlp")
    assert not hasattr(numpy_only.plan(numpy_only.signatures["serving_default"], ("output_0",)).steps[-1][0], "head")
    alias = next(iter(made["mlp"]))
    rng = np.random.default_rng(3)
    for rows in (1, native.MAX_ROWS, native.MAX_ROWS + 1):  # the last one is BLAS's (NumPy's)
        x = rng.normal(size=(rows, 28, 28)).astype(np.float32)
        got = inference.run_predict(with_c, "", {alias: x})[1]["output_0"]
        want = inference.run_predict(numpy_only, "", {alias: x})[1]["output_0"]
        assert got.dtype == want.dtype == np.float32 and got.shape == want.shape == (rows, 10)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        if rows <= native.MAX_ROWS:  # what the servable answered is the C kernel's
            out = np.empty((rows, 10), np.float32)
            assert c_kernel.run(head[0], x.reshape(rows, -1), out) is True and np.array_equal(out, got)
    fortran = np.asfortranarray(rng.normal(size=(2, 28, 28)).astype(np.float32))  # NumPy's turn
    np.testing.assert_allclose(inference.run_predict(with_c, "", {alias: fortran})[1]["output_0"],
                               inference.run_predict(numpy_only, "", {alias: fortran})[1]["output_0"], rtol=1e-5,
                               atol=1e-7)


def _reference_chain(x, prologue, layers):
    x = x.astype(np.float32)
    for op, value in prologue:
        x = x * np.float32(value) if op == 0 else x + np.float32(value)
    x = x.reshape(x.shape[0], -1)
    for weights, bias, activation in layers:
        h = x @ weights + (0 if bias is None else bias)
        if activation == 3:
            e = np.exp(h - h.max(axis=-1, keepdims=True))
            h = e / e.sum(axis=-1, keepdims=True)
        else:
            h = [h, np.maximum(h, 0), np.clip(h, 0, 6), None, 1 / (1 + np.exp(-h)), np.tanh(h)][activation]
        x = h.astype(np.float32)
    return x


def test_the_c_dense_chain_casts_rescales_and_applies_each_activation():
    from modelyard.model.graph import native

    rng = np.random.default_rng(5)
    sizes = [12, 9, 8, 33, 7, 40, 5]  # widths below, at and above the kernel's 8 and 32 blocks
    layers = tuple((rng.normal(size=(a, b)).astype(np.float32), rng.normal(size=b).astype(np.float32) if i % 2 else None,
                    i) for i, (a, b) in enumerate(zip(sizes, sizes[1:])))
    prologue = ((0, 1 / 255), (1, -0.5))
    spec = native._densechain.spec(True, prologue, 12, layers)
    for rows in (1, 3):
        x = rng.integers(0, 256, size=(rows, 3, 4)).astype(np.uint8)
        out = np.empty((rows, 5), np.float32)
        assert native._densechain.run(spec, x, out) is True
        np.testing.assert_allclose(out, _reference_chain(x, prologue, layers), rtol=1e-5, atol=1e-6)
    out = np.empty((1, 5), np.float32)
    no_cast = native._densechain.spec(False, (), 12, layers)
    assert native._densechain.run(no_cast, np.zeros((1, 12), np.float64), out) is False  # float32 only
    assert native._densechain.run(spec, np.zeros((1, 11), np.uint8), out) is False  # not rows x features
    assert native._densechain.run(spec, np.zeros((1, 24), np.uint8)[:, ::2], out) is False  # not contiguous
    assert native._densechain.run(spec, np.zeros((1, 12), np.float16), out) is False  # a cast it does not do
    with pytest.raises(ValueError, match="previous layer"):
        native._densechain.spec(False, (), 12, layers[1:])
