"""``modelyard convert`` on a Keras 3 ``.keras`` file (TensorFlow 2.21's default Keras), via the real command."""
from __future__ import annotations

import json

import numpy as np
import pytest

from modelyard.demo import demo_instances
from tests.cli_process import NOISE, modelyard


@pytest.fixture(scope="module")
def keras3_file(tmp_path_factory):
    try:
        import keras
    except ImportError:
        pytest.fail("Keras 3 is not installed: pip install -e '.[test]' (tensorflow 2.21 brings keras 3)")
    assert keras.__version__.startswith("3."), f"need Keras 3, found keras {keras.__version__}"
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((28, 28), dtype="uint8", name="image"),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10, activation="softmax", name="probabilities"),
    ])
    path = tmp_path_factory.mktemp("k3") / "digits.keras"
    model.save(path)
    with __import__("zipfile").ZipFile(path) as archive:  # really a Keras 3 file, which tf_keras cannot read
        assert json.loads(archive.read("metadata.json"))["keras_version"].startswith("3.")
    return model, path


def test_keras3_file_converts_and_its_tflite_agrees(keras3_file, tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    model, path = keras3_file
    out = tmp_path / "digits.tflite"
    result = modelyard("convert", str(path), "-o", str(out), "--representative-data", "digits", "--json")
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)
    assert report["mode"] == "none" and report["top1_agreement"] == 1.0, report
    assert not NOISE.search(result.stderr), result.stderr  # quiet, TensorFlow devices included

    images = demo_instances(16)
    runner = Interpreter(model_path=str(out)).get_signature_runner("serving_default")
    (lite,) = runner(image=images).values()
    np.testing.assert_allclose(lite, np.asarray(model.predict(images, verbose=0)), rtol=1e-5, atol=1e-6)


def test_keras3_file_cannot_take_qat(keras3_file):
    from modelyard.edge.pipeline import prepare, qat_convert
    from modelyard.model.tflite import ConvertError

    _, path = keras3_file
    prepared = prepare(str(path), representative="digits", with_report=False)
    with pytest.raises(ConvertError, match="Keras 3 models cannot be fine-tuned"):
        qat_convert(prepared, epochs=1)
