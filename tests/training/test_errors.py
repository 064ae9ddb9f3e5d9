"""Must-show 5: wrong inputs give a clear error before any process or training starts."""
from __future__ import annotations

import sys

import pytest

from .conftest import run, write_config
from modelyard.cli import main

pytestmark = pytest.mark.timeout(120)


def _train_error(capsys, config) -> str:
    assert main(["train", str(config)]) == 2
    return capsys.readouterr().err


def test_missing_build_model_is_named(tmp, capsys):
    model = tmp / "mymodel.py"
    model.write_text("def build(): pass\n")
    config = write_config(tmp, "nobuild", model=str(model))
    err = _train_error(capsys, config)
    assert "defines no build_model()" in err and "mymodel.py" in err
    assert not (tmp / "job-nobuild").exists()  # nothing started, nothing written


def test_missing_model_file_and_config(tmp, capsys):
    err = _train_error(capsys, write_config(tmp, "nofile", model=str(tmp / "absent.py")))
    assert "not found" in err and "build_model()" in err
    err = _train_error(capsys, tmp / "absent.yaml")
    assert "config file" in err and "not found" in err


def test_batch_that_does_not_divide_across_replicas(tmp, capsys):
    config = write_config(tmp, "odd", strategy="mirrored", devices={"logical_cpus": 2}, global_batch_size=33)
    err = _train_error(capsys, config)
    assert "global_batch_size 33 does not divide across 2 replicas" in err and "32 or 34" in err


def test_launch_checks_the_config_before_starting_workers(tmp):
    config = write_config(tmp, "mw-odd", strategy="multi_worker_mirrored", global_batch_size=33)
    result = run(["launch", "--workers", "2", "--", sys.executable, "-m", "modelyard", "train", str(config)])
    assert result.returncode == 2
    assert "does not divide across 2 replicas" in result.stderr
    assert "started pid" not in result.stdout
    model = tmp / "nobuild.py"
    model.write_text("x = 1\n")
    config = write_config(tmp, "mw-nobuild", strategy="multi_worker_mirrored", model=str(model))
    result = run(["launch", "--workers", "2", "--", sys.executable, "-m", "modelyard", "train", str(config)])
    assert result.returncode == 2 and "defines no build_model()" in result.stderr
    assert "started pid" not in result.stdout


@pytest.mark.parametrize("values, message", [
    ({"strategy": "mirroed"}, "strategy.name: 'mirroed' is not one of"),
    ({"strategy": {"name": "mirrored", "cross_device_ops": "fast"}}, "cross_device_ops"),
    ({"epochs": 0}, "epochs: must be an integer >= 1"),
    ({"learning_rate_scaling": "linear"}, "needs base_batch_size"),
    ({"devices": {"gpu_memory": 1}}, "devices: unknown key"),
    ({"optimiser": "sgd"}, "config: unknown key(s) optimiser"),
    ({"data": {"source": "records/*.tfrecord", "shape": [28, 28]}}, "steps_per_epoch: needed for TFRecord"),
    ({"strategy": {"name": "multi_worker_mirrored", "collective_timeout": -1}}, "collective_timeout: must be"),
    # A storage URI was read as a local relative path (<config dir>/gs:/b/run) and written there silently.
    ({"job_dir": "s3://b/run"}, "job_dir: s3://b/run is a storage URI of a scheme modelyard train does not write"),
])
def test_config_mistakes_are_named(tmp, capsys, values, message):
    assert message in _train_error(capsys, write_config(tmp, "bad", **values))


@pytest.mark.parametrize("values, key", [
    ({"job_dir": "gs://b/run"}, "job_dir: gs://b/run"),
    ({"export_to": "gs://b/model"}, "export_to: gs://b/model"),
    ({"data": {"train": "gs://b/train-*.tfrecord", "shape": [28, 28]}, "steps_per_epoch": 2},
     "data.train: gs://b/train-*.tfrecord"),
])
def test_a_gs_path_without_a_storage_names_storage_emulator_host(tmp, capsys, monkeypatch, values, key):
    """gs:// paths are the platform's storage (tests/training/test_gcs_train.py); with no storage named,
    the error says which variable names it, before anything starts."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    err = _train_error(capsys, write_config(tmp, "bad", **values))
    assert f"{key} is a gs:// URI and no storage is named: export STORAGE_EMULATOR_HOST" in err, err


def test_uncompiled_model_and_gpu_only_options(tmp):
    model = tmp / "raw.py"
    model.write_text("import tf_keras as keras\n"
                     "def build_model():\n"
                     "    return keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(10)])\n")
    result = run(["train", str(write_config(tmp, "raw", model=str(model)))])
    assert result.returncode == 2 and "uncompiled model" in result.stderr and "compile" in result.stderr
    config = write_config(tmp, "nccl", strategy={"name": "mirrored", "cross_device_ops": "nccl"},
                          devices={"logical_cpus": 2, "gpu_memory_growth": True})
    result = run(["train", str(config)])
    assert result.returncode == 2
    assert "nccl needs GPUs" in result.stderr and "reduce_to_one" in result.stderr
    assert "gpu_memory_growth need a GPU" in result.stderr  # accepted, explained, ignored


def test_launch_usage_errors():
    assert run(["launch", "--", "true"]).returncode == 2
    result = run(["launch", "--workers", "1"])
    assert result.returncode == 2 and "no command" in result.stderr
    result = run(["launch", "--workers", "1", "--task", "worker:0", "--", "true"])
    assert result.returncode == 2 and "--cluster-spec" in result.stderr
