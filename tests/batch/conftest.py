"""Session-scoped models and data writers for the batch prediction tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import modelyard  # noqa: F401  (sets the TF/Keras environment before TensorFlow is imported)
import numpy as np
import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


class TinyModel:
    """A 4 -> 3 softmax classifier exported as ``base/0001``, with a NumPy reference of its math."""

    def __init__(self, base: Path, kernel: np.ndarray, bias: np.ndarray):
        self.base, self.kernel, self.bias = base, kernel, bias

    def reference(self, x) -> np.ndarray:
        logits = np.asarray(x, np.float32) @ self.kernel + self.bias
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> TinyModel:
    import tensorflow as tf

    keras = tf.keras
    keras.utils.set_random_seed(7)
    inputs = keras.Input((4,), name="x")
    outputs = keras.layers.Dense(3, activation="softmax", name="scores")(inputs)
    model = keras.Model(inputs, outputs)
    base = tmp_path_factory.mktemp("models") / "tiny"
    modelyard.export(model, base)
    kernel, bias = (w.numpy() for w in model.layers[-1].weights)
    return TinyModel(base, kernel, bias)


S3_BUCKET = "modelyard-batch"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server (``moto[server]``, test extra) on a free port, dummy credentials, one bucket."""
    from modelyard.ports import free_port
    from tests.platform.conftest import require, wait_http

    require("moto.server", "pip install -e '.[test]' (it installs moto[server])")
    require("s3fs", "pip install -e '.[test]' (it installs s3fs)")
    boto3 = require("boto3", "pip install -e '.[test]' (moto brings boto3)")
    port = free_port()
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    try:
        wait_http(url + "/moto-api/", 30, proc, log)
        os.environ.update(env)  # this process and the CLI processes it starts
        client = boto3.client("s3", endpoint_url=url)
        client.create_bucket(Bucket=S3_BUCKET)
        yield client
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait(10)


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 4)).round(4).astype(np.float32)


def write_jsonl(path: Path, lines: list) -> Path:
    with open(path, "w") as f:
        for line in lines:
            f.write(line if isinstance(line, str) else json.dumps(line))
            f.write("\n")
    return path


def cli_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(SRC), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "modelyard", "batch-predict", *args]


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def bytes_model(tmp_path_factory) -> Path:
    """A SavedModel taking strings: ``serving_default`` parses tf.Examples (sum of feature x[4]),
    ``length`` returns each string's byte length. Base path with version 0001."""
    import tensorflow as tf

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def parse(self, examples):
            parsed = tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([4], tf.float32)})
            return {"total": tf.reduce_sum(parsed["x"], axis=1)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="data")])
        def length(self, data):
            return {"bytes": tf.strings.length(data)}

    module = Module()
    base = tmp_path_factory.mktemp("models") / "bytes"
    tf.saved_model.save(module, str(base / "0001"),
                        signatures={"serving_default": module.parse, "length": module.length})
    return base


class Recorded:
    """Bytes served by ranges, each fetch recorded (what a ranged read of an object would ask for)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.fetched = data, []

    def __call__(self, start: int, end: int) -> bytes:
        self.fetched.append((start, end))
        return self.data[start:end]

    def source(self, name: str = "gs://bucket/input"):
        from modelyard.batch.readers import RangedSource

        ranged = RangedSource(name, len(self.data), self)
        ranged.read_ahead = 8  # a TFRecord header (12 bytes) straddles windows
        return ranged
