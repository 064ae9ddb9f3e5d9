"""Must-show 2: on a model whose activation range is wide, post-training int8 loses accuracy
and quantization-aware fine-tuning recovers at least half of the loss."""
from __future__ import annotations

import json

import pytest

from modelyard.cli import main

# One hidden unit fires ~20x wider than the rest; the next layer ignores it, so the
# float model is unaffected, but a per-tensor int8 scale sized for it rounds the
# useful units to a handful of levels.
OUTLIER_WEIGHT = 20.0


@pytest.fixture(scope="module")
def wide_model_file(tmp_path_factory):
    import tensorflow as tf

    from modelyard.datasets import load_digits_28

    images, labels = load_digits_28("train")
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((28, 28), dtype="uint8", name="image")
    x = tf.keras.layers.Rescaling(1 / 255.0)(inputs)
    x = tf.keras.layers.Flatten()(x)
    x = tf.keras.layers.Dense(32, activation="relu", name="wide")(x)
    outputs = tf.keras.layers.Dense(10, activation="softmax", name="probabilities")(x)
    model = tf.keras.Model(inputs, outputs)
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(images, labels, epochs=10, batch_size=32, verbose=0)

    kernel, bias = model.get_layer("wide").get_weights()
    kernel[:, 0], bias[0] = OUTLIER_WEIGHT, 0.0
    model.get_layer("wide").set_weights([kernel, bias])
    kernel, bias = model.get_layer("probabilities").get_weights()
    kernel[0, :] = 0.0
    model.get_layer("probabilities").set_weights([kernel, bias])

    path = tmp_path_factory.mktemp("qat") / "wide.keras"
    model.save(path)
    return path


def _report(capsys) -> dict:
    return json.loads(capsys.readouterr().out)[0]


def test_qat_recovers_post_training_loss(wide_model_file, tmp_path, capsys):
    ptq_out, qat_out = tmp_path / "ptq.tflite", tmp_path / "qat.tflite"
    assert main(["convert", str(wide_model_file), "-o", str(ptq_out), "--quantize", "int8",
                 "--representative-data", "digits", "--json"]) == 0
    ptq = _report(capsys)
    assert main(["convert", str(wide_model_file), "-o", str(qat_out), "--qat", "--epochs", "1",
                 "--representative-data", "digits", "--io-dtype", "uint8", "--json"]) == 0
    qat = _report(capsys)

    original = ptq["original_accuracy"]
    assert original > 0.9
    ptq_loss = original - ptq["accuracy"]
    assert ptq_loss > 0.05, f"the test model should lose accuracy under post-training int8: {ptq}"
    recovered = qat["accuracy"] - ptq["accuracy"]
    assert recovered >= ptq_loss / 2, f"post-training {ptq['accuracy']:.4f}, QAT {qat['accuracy']:.4f}, float {original:.4f}"
    assert qat["mode"] == "qat-int8" and qat["io_dtype"] == "uint8"
    assert qat_out.stat().st_size == qat["size_bytes"]


def test_qat_needs_a_keras_model(demo_base, tmp_path, capsys):
    out = tmp_path / "x.tflite"
    assert main(["convert", str(demo_base), "-o", str(out), "--qat", "--representative-data", "digits",
                 "--no-report"]) == 1
    assert ".keras" in capsys.readouterr().err
    assert not out.exists()
