"""modelyard.demo: the two-version digits model, built once even under concurrent callers."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import modelyard  # noqa: F401  (before tensorflow: selects tf_keras, quiets logs)
from modelyard import demo
from modelyard.datasets import load_digits_28
from modelyard.model.savedmodel import meta_graph, read_saved_model

_BUILD = (
    "import sys; from pathlib import Path; from modelyard.demo import ensure_demo_model; "
    "print('BASE', ensure_demo_model(Path(sys.argv[1])), flush=True)"
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two processes ask for the demo model at once: one builds, the other waits and reuses."""
    cache = tmp_path_factory.mktemp("cache")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILD, str(cache)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(2)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        outputs.append(out)
    return cache, outputs


def test_concurrent_callers_build_each_version_once(built):
    cache, outputs = built
    base = cache / "models" / "my_mnist_model"
    combined = "".join(outputs)
    assert combined.count("building demo model version 1 (first run only") == 1, combined
    assert combined.count("building demo model version 2 (first run only") == 1, combined
    assert all(f"BASE {base}\n" in out for out in outputs), outputs
    assert sorted(os.listdir(base)) == ["0001", "0002"]  # no temp dirs, no extra versions


def test_second_call_reuses_without_rebuilding(built):
    cache, _ = built
    base = cache / "models" / "my_mnist_model"
    before = {p: p.stat().st_mtime_ns for p in base.glob("*/saved_model.pb")}
    messages: list[str] = []
    assert demo.ensure_demo_model(cache, log=messages.append) == base
    assert messages == []
    assert {p: p.stat().st_mtime_ns for p in base.glob("*/saved_model.pb")} == before


@pytest.mark.parametrize("version", ["0001", "0002"])
def test_serving_default_signature(built, version):
    from tensorflow.core.framework import types_pb2

    cache, _ = built
    sig = meta_graph(read_saved_model(cache / "models" / "my_mnist_model" / version)).signature_def[
        "serving_default"
    ]
    assert sig.method_name == "tensorflow/serving/predict"
    (image,) = sig.inputs.values()
    (probs,) = sig.outputs.values()
    assert list(sig.inputs) == ["image"] and list(sig.outputs) == ["probabilities"]
    assert image.dtype == types_pb2.DT_UINT8
    assert [d.size for d in image.tensor_shape.dim] == [-1, 28, 28]
    assert probs.dtype == types_pb2.DT_FLOAT
    assert [d.size for d in probs.tensor_shape.dim] == [-1, 10]


def test_versions_differ_and_reach_90_percent(built):
    import tensorflow as tf

    cache, _ = built
    images, labels = load_digits_28("test")
    n_variables = {}
    for version in ("0001", "0002"):
        loaded = tf.saved_model.load(str(cache / "models" / "my_mnist_model" / version))
        probs = loaded.signatures["serving_default"](image=tf.constant(images))["probabilities"]
        accuracy = float(np.mean(np.argmax(probs.numpy(), axis=1) == labels))
        assert accuracy >= 0.9, (version, accuracy)
        n_variables[version] = len(loaded.variables)
    assert n_variables == {"0001": 4, "0002": 6}  # one vs two hidden Dense layers


def test_demo_instances_show_different_digits():
    images, labels = load_digits_28("test")
    first = demo.demo_instances(10)
    assert first.dtype == np.uint8 and first.shape == (10, 28, 28)
    # Which test image each instance is, hence its true digit: 0..9, one each.
    index = {images[i].tobytes(): i for i in range(len(images))}
    digits = [int(labels[index[image.tobytes()]]) for image in first]
    assert digits == list(range(10))
    assert len({image.tobytes() for image in demo.demo_instances(len(images))}) == len(images)  # all of them
    many = demo.demo_instances(len(images) + 2)
    np.testing.assert_array_equal(many[len(images):], first[:2])  # wraps around
    assert demo.demo_instances(0).shape == (0, 28, 28)
    with pytest.raises(ValueError, match="n must be >= 0"):
        demo.demo_instances(-1)


def test_the_demo_model_tells_the_first_instances_apart(built):
    import tensorflow as tf

    cache, _ = built
    loaded = tf.saved_model.load(str(cache / "models" / "my_mnist_model" / "0002"))
    probs = loaded.signatures["serving_default"](image=tf.constant(demo.demo_instances(3)))["probabilities"]
    assert list(np.argmax(probs.numpy(), axis=1)) == [0, 1, 2]


def test_demo_curl_command():
    command = demo.demo_curl_command(8501)
    argv = shlex.split(command)  # pastes into a shell as one well-formed command
    assert argv[0] == "curl"
    assert "http://localhost:8501/v1/models/my_mnist_model:predict" in argv
    body = json.loads(argv[argv.index("-d") + 1])
    assert np.asarray(body["instances"]).shape == (1, 28, 28)
    assert "/v1/models/other:predict" in demo.demo_curl_command(9000, model_name="other")


def test_default_cache_dir(monkeypatch):
    monkeypatch.setenv("MODELYARD_CACHE", "/x/cache")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert demo.default_cache_dir() == Path("/x/cache")
    monkeypatch.delenv("MODELYARD_CACHE")
    assert demo.default_cache_dir() == Path("/xdg/modelyard")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/someone")
    assert demo.default_cache_dir() == Path("/home/someone/.cache/modelyard")


def test_incomplete_version_dir_is_reported_not_overwritten(tmp_path):
    (tmp_path / "models" / "my_mnist_model" / "0001").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="holds no saved_model.pb"):
        demo.ensure_demo_model(tmp_path, log=lambda _: None)
