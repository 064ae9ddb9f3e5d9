"""Bad input fails clearly, before conversion where possible, and writes nothing."""
from __future__ import annotations

import numpy as np
import pytest

import modelyard
from modelyard.cli import main


@pytest.fixture(scope="module")
def float_base(tmp_path_factory):
    """A tiny float-input model exported as version 1 and 2 of a base path."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,), name="features"), tf.keras.layers.Dense(3, activation="softmax")])
    base = tmp_path_factory.mktemp("float") / "tiny"
    modelyard.export(model, base)
    modelyard.export(model, base)
    return base


@pytest.fixture(scope="module")
def flex_base(tmp_path_factory):
    """A SavedModel using MatrixDeterminant, which the builtin TFLite op set lacks."""
    import tensorflow as tf

    class Det(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3, 3], tf.float32, name="m")])
        def det(self, m):
            return {"det": tf.linalg.det(m)}

    module = Det()
    base = tmp_path_factory.mktemp("flex") / "det"
    tf.saved_model.save(module, str(base / "0001"), signatures={"serving_default": module.det})
    return base


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def test_unsupported_ops_are_named(flex_base, tmp_path, capsys):
    out = tmp_path / "det.tflite"
    assert main(["convert", str(flex_base), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "MatrixDeterminant" in err and "--allow-tf-ops" in err
    assert not out.exists()


def test_allow_tf_ops_converts(flex_base, tmp_path, capsys):
    out = tmp_path / "det.tflite"
    assert main(["convert", str(flex_base), "-o", str(out), "--allow-tf-ops"]) == 0
    assert out.stat().st_size > 0
    assert "Flex" in capsys.readouterr().err  # honest: this LiteRT cannot run it, so no report


def test_int8_without_representative_data(float_base, tmp_path, capsys):
    out = tmp_path / "x.tflite"
    assert main(["convert", str(float_base), "-o", str(out), "--quantize", "int8"]) == 1
    assert "--representative-data" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "array, problem",
    [
        (np.zeros((10, 5), np.float32), "shape mismatch"),
        (np.zeros((10, 4), np.float64), "dtype mismatch"),
        (np.zeros((10, 2, 2), np.float32), "shape mismatch"),
    ],
)
def test_mismatched_representative_data(float_base, tmp_path, capsys, array, problem):
    data = _npz(tmp_path / "rep.npz", features=array)
    into = tmp_path / "lite"
    code = main(["convert", str(float_base), "--into", str(into), "--quantize", "int8", "--representative-data", data])
    assert code == 1
    err = capsys.readouterr().err
    assert problem in err and "'features'" in err and "float32 [-1, 4]" in err
    assert not into.exists() or not any(into.iterdir())


def test_wrong_npz_keys(float_base, tmp_path, capsys):
    data = _npz(tmp_path / "rep.npz", a=np.zeros((3, 4), np.float32), b=np.zeros((3, 4), np.float32))
    assert main(["convert", str(float_base), "-o", str(tmp_path / "x.tflite"), "--quantize", "int8",
                 "--representative-data", data]) == 1
    assert "features" in capsys.readouterr().err


def test_io_dtype_needs_int8(float_base, tmp_path, capsys):
    assert main(["convert", str(float_base), "-o", str(tmp_path / "x.tflite"), "--io-dtype", "uint8"]) == 1
    assert "--quantize int8" in capsys.readouterr().err


def test_int8_float_model_with_int8_io(float_base, tmp_path, capsys):
    """A float-input model gets quantized int8 I/O; the report dequantizes to compare."""
    import json

    rng = np.random.default_rng(0)
    data = _npz(tmp_path / "rep.npz", features=rng.standard_normal((64, 4)).astype(np.float32))
    out = tmp_path / "x.tflite"
    assert main(["convert", f"{float_base}:1", "-o", str(out), "--quantize", "int8", "--io-dtype", "int8",
                 "--representative-data", data, "--eval-data", data, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)[0]
    assert report["max_abs_diff"] < 0.05 and report["top1_agreement"] >= 0.9


def test_source_resolution(float_base):
    from modelyard.model.tflite import ConvertError
    from modelyard.edge.source import resolve_version_dir

    assert resolve_version_dir(str(float_base)).name == "0002"  # latest
    assert resolve_version_dir(f"{float_base}:1").name == "0001"
    assert resolve_version_dir(str(float_base / "0001")).name == "0001"
    with pytest.raises(ConvertError, match="version 7 not found"):
        resolve_version_dir(f"{float_base}:7")
    with pytest.raises(ConvertError, match="does not exist"):
        resolve_version_dir(str(float_base / "nope"))
