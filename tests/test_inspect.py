"""``modelyard inspect``: TF Serving's test models (generated, and its own where present) and a fresh export."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import modelyard  # noqa: F401  (before tensorflow: selects tf_keras, quiets logs)
from modelyard.cli import main


@pytest.fixture
def half_plus_two(tfserving_testdata) -> Path:
    """The TF1 half_plus_two version directory (generated, and TF Serving's own where present)."""
    return tfserving_testdata / "saved_model_half_plus_two_cpu" / "00000123"


def inspect(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["inspect", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_matches_saved_model_cli_layout(capsys, half_plus_two):
    code, out, _ = inspect(capsys, half_plus_two)
    assert code == 0
    assert "MetaGraphDef with tag-set: 'serve' contains the following SignatureDefs:" in out
    assert (
        "signature_def['serving_default']:\n"
        "  The given SavedModel SignatureDef contains the following input(s):\n"
        "    inputs['x'] tensor_info:\n"
        "        dtype: DT_FLOAT\n"
        "        shape: (-1, 1)\n"
        "        name: x:0\n"
        "  The given SavedModel SignatureDef contains the following output(s):\n"
        "    outputs['y'] tensor_info:\n"
        "        dtype: DT_FLOAT\n"
        "        shape: (-1, 1)\n"
        "        name: y:0\n"
        "  Method name is: tensorflow/serving/predict\n"
    ) in out
    assert "        dtype: DT_STRING\n        shape: unknown_rank\n        name: tf_example:0" in out
    assert "Method name is: tensorflow/serving/classify" in out
    assert "contains the following ops: {" in out and "'VariableV2'" in out


def test_json_agrees_with_tf_serving_metadata(capsys, half_plus_two, tfserving_testdata):
    code, out, _ = inspect(capsys, half_plus_two, "--json")
    assert code == 0
    info = json.loads(out)
    ours = info["tag_sets"]["serve"]["signatures"]
    truth = json.loads((tfserving_testdata / "half_plus_two_model_metadata.json").read_text())
    expected = truth["metadata"]["signature_def"]["signature_def"]
    assert sorted(ours) == sorted(expected)
    for key, sig in expected.items():
        assert ours[key]["method_name"] == sig["method_name"]
        for kind in ("inputs", "outputs"):
            assert sorted(ours[key][kind]) == sorted(sig[kind])
            for name, tensor in sig[kind].items():
                shape = tensor["tensor_shape"]
                want = None if shape["unknown_rank"] else [int(d["size"]) for d in shape["dim"]]
                assert ours[key][kind][name] == {
                    "name": tensor["name"], "dtype": tensor["dtype"], "shape": want
                }


def test_base_path_uses_latest_version_via_subprocess(tfserving_testdata):
    base = tfserving_testdata / "saved_model_half_plus_two_tf2_cpu"
    proc = subprocess.run(
        [sys.executable, "-m", "modelyard", "inspect", str(base)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"showing its latest version 123 ({base / '00000123'})" in proc.stdout
    assert "signature_def['serving_default']:" in proc.stdout


def test_tflite_model(capsys, tfserving_testdata):
    code, out, _ = inspect(capsys, tfserving_testdata / "saved_model_half_plus_two_tflite")
    assert code == 0
    assert "inputs['x']" in out and "outputs['y']" in out and "dtype: float32" in out

    code, out, _ = inspect(capsys, tfserving_testdata / "saved_model_half_plus_two_tflite", "--json")
    tflite = json.loads(out)["tflite"]
    assert [(t["name"], t["dtype"], t["shape"]) for t in tflite["inputs"]] == [("x", "float32", [1, 1])]
    assert [(t["name"], t["dtype"], t["shape"]) for t in tflite["outputs"]] == [("y", "float32", [1, 1])]


def test_needs_only_the_graph_proto(tmp_path, capsys, half_plus_two):
    # No variables/ and no assets/: reading signatures must not restore anything.
    shutil.copy(half_plus_two / "saved_model.pb", tmp_path / "saved_model.pb")
    code, out, _ = inspect(capsys, tmp_path, "--json")
    assert code == 0
    assert json.loads(out)["tag_sets"]["serve"]["signatures"]["serving_default"]["inputs"]["x"]["shape"] == [-1, 1]


def test_broken_export_is_a_clear_error(capsys, tfserving_testdata):
    code, out, err = inspect(capsys, tfserving_testdata / "bad_half_plus_two")
    assert code == 1 and out == ""
    assert "modelyard inspect: error:" in err and "Could not find SavedModel" in err


def test_bad_directories_exit_1(tmp_path, capsys):
    code, _, err = inspect(capsys, tmp_path / "missing")
    assert code == 1 and "is not a directory" in err

    code, _, err = inspect(capsys, tmp_path)
    assert code == 1 and "holds no model" in err

    (tmp_path / "saved_model.pb").write_bytes(b"\xff\xfe not a proto")
    code, _, err = inspect(capsys, tmp_path)
    assert code == 1 and "is not a valid SavedModel" in err

    os.remove(tmp_path / "saved_model.pb")
    (tmp_path / "model.tflite").write_bytes(b"not a flatbuffer")
    code, _, err = inspect(capsys, tmp_path)
    assert code == 1 and "not a valid TFLite model" in err


def test_exported_keras_model(tmp_path, capsys):
    import tensorflow as tf

    from modelyard import export

    inputs = tf.keras.Input((28, 28), dtype="uint8", name="image")
    x = tf.keras.layers.Flatten()(tf.keras.layers.Rescaling(1 / 255)(inputs))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10, name="probabilities")(x))
    export(model, tmp_path / "m")
    export(model, tmp_path / "m")

    code, out, _ = inspect(capsys, tmp_path / "m", "--json")
    assert code == 0
    info = json.loads(out)
    assert info["version"] == 2 and info["path"] == str(tmp_path / "m" / "0002")
    sig = info["tag_sets"]["serve"]["signatures"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    assert sig["inputs"]["image"]["dtype"] == "DT_UINT8"
    assert sig["inputs"]["image"]["shape"] == [-1, 28, 28]
    assert sig["outputs"]["probabilities"] == {
        "name": sig["outputs"]["probabilities"]["name"], "dtype": "DT_FLOAT", "shape": [-1, 10]
    }
