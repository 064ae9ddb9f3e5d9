"""modelyard.export: versioned, atomic SavedModel export of tf_keras and Keras 3 models."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import modelyard  # noqa: F401  (before tensorflow: selects tf_keras, quiets logs)
import tensorflow as tf

from modelyard import export
from modelyard.model.export import latest_version, list_versions


@pytest.fixture(scope="module")
def tf_keras_model():
    tf.keras.utils.set_random_seed(1)
    inputs = tf.keras.Input((4,), name="features")
    outputs = tf.keras.layers.Dense(3, activation="softmax", name="scores")(inputs)
    return tf.keras.Model(inputs, outputs)


def _hidden_entries(base: Path) -> list[str]:
    return [p.name for p in base.iterdir() if p.name.startswith(".")] if base.exists() else []


def test_exports_consecutive_versions_and_serving_default_matches_predict(tmp_path, tf_keras_model):
    base = tmp_path / "models" / "m"  # parents created on demand
    first = export(tf_keras_model, base)
    second = export(tf_keras_model, base)

    assert first == base / "0001" and second == base / "0002"
    assert (first / "saved_model.pb").is_file() and (second / "saved_model.pb").is_file()
    assert _hidden_entries(base) == []

    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    signature = tf.saved_model.load(str(second)).signatures["serving_default"]
    (got,) = signature(features=tf.constant(x)).values()
    np.testing.assert_allclose(got.numpy(), tf_keras_model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def test_next_version_follows_highest_integer_dir_and_ignores_others(tmp_path, tf_keras_model):
    base = tmp_path / "m"
    (base / "00000123").mkdir(parents=True)  # TF Serving style, unpadded width
    (base / "notes").mkdir()
    (base / ".tmp-9999-abcd").mkdir()  # someone else's in-flight export: not a version
    (base / "7").mkdir()

    assert export(tf_keras_model, base) == base / "0124"
    assert sorted(list_versions(base)) == [7, 123, 124]
    assert latest_version(base) == (124, base / "0124")


def test_explicit_version_and_refusing_an_existing_one(tmp_path, tf_keras_model):
    base = tmp_path / "m"
    assert export(tf_keras_model, base, version=5) == base / "0005"
    before = sorted(os.listdir(base))
    with pytest.raises(FileExistsError, match="version 5 already exists"):
        export(tf_keras_model, base, version=5)
    assert sorted(os.listdir(base)) == before
    with pytest.raises(ValueError, match="non-negative integer"):
        export(tf_keras_model, base, version=-1)


def test_not_a_model_leaves_nothing_behind(tmp_path):
    base = tmp_path / "m"
    with pytest.raises(TypeError, match="needs a Keras model"):
        export({"weights": [1, 2]}, base)
    assert not base.exists()


def test_failed_save_removes_temp_dir(tmp_path):
    # A subclassed model that was never called saves, but without serving_default.
    class Unbuilt(tf.keras.Model):
        def call(self, x):
            return x

    base = tmp_path / "m"
    (base / "0001").mkdir(parents=True)
    with pytest.raises(ValueError, match="serving_default"):
        export(Unbuilt(), base)
    assert sorted(os.listdir(base)) == ["0001"]


def test_keras3_model_exports_and_loads(tmp_path):
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3."):
        pytest.skip(f"Keras 3 not installed (found {keras.__version__})")
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    path = export(model, tmp_path / "k3")

    assert path == tmp_path / "k3" / "0001"
    assert _hidden_entries(tmp_path / "k3") == []
    x = np.ones((3, 4), np.float32)
    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    (got,) = signature(tf.constant(x)).values()
    np.testing.assert_allclose(got.numpy(), np.asarray(model.predict(x, verbose=0)), rtol=1e-5, atol=1e-6)


def test_export_says_where_it_wrote(tmp_path, tf_keras_model, capsys):
    path = export(tf_keras_model, tmp_path / "m")
    out, err = capsys.readouterr()
    assert err.splitlines()[-1] == f"modelyard.export: exported version 1 to {path}"
    assert out == ""  # stdout stays the caller's
    export(tf_keras_model, tmp_path / "m", quiet=True)
    assert "exported" not in capsys.readouterr().err
