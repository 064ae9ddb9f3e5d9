"""Must-show 6: the version a training job exports is served by ``modelyard serve``."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from .conftest import ENV, MODELYARD, kill_group, run, write_config
from modelyard.ports import free_ports
from tests.warm_process import popen_python


def _get(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, OSError, ValueError):
        return None


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _wait_available(url: str, version: str, proc, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"modelyard serve exited with {proc.returncode}"
        status = _get(url) or {}
        states = {v.get("version"): v.get("state") for v in status.get("model_version_status", [])}
        if states.get(version) == "AVAILABLE":
            return
        time.sleep(0.5)
    raise AssertionError(f"version {version} never became AVAILABLE at {url}: {status}")


@pytest.mark.timeout(300)
def test_trained_version_is_served_and_predicts(tmp):
    from modelyard.datasets import load_digits_28

    base = tmp / "models" / "my_mnist_model"
    config = write_config(tmp, "serve", strategy="one_device", global_batch_size=64, epochs=3, export_to=str(base))
    result = run(["train", str(config)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (base / "0001").is_dir()

    grpc_port, rest_port = free_ports(2)
    # Forked warm, as the training runs are (tests/warm_process.py): the real `modelyard serve`.
    server = popen_python(
        MODELYARD + ["serve", "--model_name", "my_mnist_model", "--model_base_path", str(base),
                     "--port", str(grpc_port), "--rest_api_port", str(rest_port)],
        ENV, tmp / "serve.log",
    )
    try:
        root = f"http://127.0.0.1:{rest_port}/v1/models/my_mnist_model"
        _wait_available(root, "1", server)
        images, labels = load_digits_28("test")
        answer = _post(root + ":predict", {"instances": images[:20].tolist()})
        probabilities = np.asarray(answer["predictions"])
        assert probabilities.shape == (20, 10)
        assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-4)
        assert np.mean(probabilities.argmax(axis=1) == labels[:20]) >= 0.8

        # Training again exports version 2, which the running server picks up.
        result = run(["train", str(config), "--fresh", "--epochs", "1"])
        assert result.returncode == 0, result.stderr[-3000:]
        assert (base / "0002").is_dir()
        _wait_available(root, "2", server)
    finally:
        kill_group(server)
