"""Must-show 1-3: strategies agree with one device, and reach accuracy, on real processes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from .conftest import model_weights, run, write_config


def _train(tmp, name, timeout=240, **values):
    config = write_config(tmp, name, **values)
    result = run(["train", str(config)], timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def _history(path):
    return [epoch["loss"] for epoch in json.loads(path.read_text())["epochs"]]


@pytest.mark.timeout(180)
def test_mirrored_on_two_logical_cpus_matches_one_device(tmp):
    common = dict(global_batch_size=64, epochs=2, steps_per_epoch=10, seed=3)
    _train(tmp, "one", strategy="one_device", export_to=str(tmp / "one"), **common)
    _train(tmp, "mirrored", strategy={"name": "mirrored", "devices": ["CPU:0", "CPU:1"]},
           devices={"logical_cpus": 2}, export_to=str(tmp / "mirrored"), **common)
    metrics = json.loads((tmp / "job-mirrored" / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and metrics["epochs_completed"] == 2
    one, mirrored = model_weights(tmp / "one" / "0001"), model_weights(tmp / "mirrored" / "0001")
    assert one.keys() == mirrored.keys() and len(one) == 4  # two Dense layers: kernels and biases
    for name in one:
        assert np.max(np.abs(one[name] - mirrored[name])) <= 1e-5, name
    assert max(np.max(np.abs(v)) for v in one.values()) > 0  # trained, not trivially equal


@pytest.mark.timeout(240)
def test_multi_worker_mirrored_matches_a_single_worker(tmp):
    common = dict(global_batch_size=64, epochs=3, steps_per_epoch=10, seed=5)
    _train(tmp, "single", strategy="default", **common)
    config = write_config(tmp, "mwms", strategy="multi_worker_mirrored", **common)
    result = run(["launch", "--workers", "2", "--", *_train_cmd(config)], timeout=200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "worker:0 | epoch 3/3" in result.stdout and "worker:1 | epoch 3/3" in result.stdout
    worker0 = _history(tmp / "job-mwms" / "metrics.json")
    worker1 = _history(tmp / "job-mwms" / "metrics.worker-1.json")
    single = _history(tmp / "job-single" / "metrics.json")
    assert len(worker0) == 3 and worker0 == worker1  # both workers report the same all-reduced loss
    assert np.max(np.abs(np.array(worker0) - np.array(single))) <= 1e-5
    assert json.loads((tmp / "job-mwms" / "metrics.json").read_text())["replicas"] == 2


def _train_cmd(config):
    import sys

    return [sys.executable, "-m", "modelyard", "train", str(config)]


@pytest.mark.timeout(240)
def test_parameter_server_reaches_90_percent(tmp):
    """Keras fit (asynchronous) on a chief, two workers and two ps tasks; the one cluster also shows
    the big variables split across both ps tasks (test_sharded_ps: the same under modelyard's loop)."""
    from .test_sharded_ps import EPOCHS, SHARDED, assert_split_across_two_ps

    config = write_config(tmp, "ps", strategy=SHARDED, **EPOCHS)
    result = run(["launch", "--workers", "2", "--ps", "2", "--", *_train_cmd(config)], timeout=200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "chief:0 | epoch 3/3" in result.stdout
    metrics = json.loads((tmp / "job-ps" / "metrics.json").read_text())
    assert metrics["strategy"] == "parameter_server" and metrics["epochs_completed"] == 3
    assert_split_across_two_ps(result.stdout, metrics)
    assert metrics["epochs"][-1]["val_accuracy"] >= 0.90


@pytest.mark.timeout(180)
def test_central_storage_reaches_90_percent(tmp):
    _train(tmp, "cs", strategy={"name": "central_storage", "compute_devices": ["CPU:0", "CPU:1"],
                                "parameter_device": "CPU:0"},
           devices={"logical_cpus": 2}, global_batch_size=64, epochs=4)
    metrics = json.loads((tmp / "job-cs" / "metrics.json").read_text())
    assert metrics["replicas"] == 2
    assert metrics["epochs"][-1]["val_accuracy"] >= 0.90
