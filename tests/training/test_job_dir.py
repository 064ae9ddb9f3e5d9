"""What a training job leaves in its job directory, its progress lines and its input report."""
from __future__ import annotations

import json
import textwrap

import pytest

from .conftest import run, write_config

SLOW_INPUT_MODEL = textwrap.dedent('''
    """Digits MLP fed by a pipeline that sleeps per batch: training must wait for input."""
    import time

    import numpy as np
    import tensorflow as tf

    from modelyard.datasets import load_digits_28
    from modelyard.training.demo import build_model  # noqa: F401

    def make_dataset(input_context, split):
        x, y = load_digits_28("train" if split == "train" else "test")
        batch = input_context.get_per_replica_batch_size(32) if input_context else 32

        def slow(images):
            time.sleep(0.1)  # a slow read per batch, far slower than a training step even on a loaded machine
            return images

        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
        return ds.map(lambda a, b: (tf.ensure_shape(tf.numpy_function(slow, [a], tf.uint8), a.shape), b))
''')


@pytest.mark.timeout(180)
def test_job_dir_has_metrics_tensorboard_checkpoints_and_resolved_config(tmp):
    config = write_config(tmp, "jd", strategy="one_device", global_batch_size=64, epochs=2, steps_per_epoch=20,
                          tensorboard=True, input_report=True)
    result = run(["train", str(config)])
    assert result.returncode == 0, result.stderr[-3000:]
    job = tmp / "job-jd"
    metrics = json.loads((job / "metrics.json").read_text())
    assert metrics["completed"] is True and metrics["epochs_completed"] == 2 and metrics["strategy"] == "one_device"
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    for epoch in metrics["epochs"]:
        assert epoch["steps"] == 20 and epoch["samples_per_sec"] > 0 and epoch["seconds"] > 0
        assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(epoch)
    assert metrics["samples_per_sec"] > 0
    report = metrics["input_report"]
    # The share is measured, so it moves with the machine's load: only its form is checked here; that a slow
    # input is called input-bound is test_input_bound_training_is_reported's.
    assert isinstance(report["input_bound"], bool) and 0 <= report["input_share"] <= 1
    assert ("not input-bound" in result.stdout) is not report["input_bound"]  # the line says what the report says
    resolved = json.loads((job / "config.resolved.json").read_text())
    assert resolved["strategy"]["name"] == "one_device" and resolved["global_batch_size"] == 64
    assert resolved["job_dir"] == str(job) and resolved["model"] == "modelyard.training.demo"
    assert list((job / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert list((job / "tensorboard" / "validation").glob("events.out.tfevents.*"))
    assert (job / "checkpoints" / "ckpt-0002.index").exists()
    # One progress line per epoch: steps, loss and samples/s.
    lines = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 2 and lines[1].startswith("epoch 2/2  20 steps  loss ") and "samples/s" in lines[1]


@pytest.mark.timeout(180)
def test_input_bound_training_is_reported(tmp):
    model = tmp / "slow_input.py"
    model.write_text(SLOW_INPUT_MODEL)
    # Two short epochs: the training rate compared is the second epoch's (the first's includes
    # tracing), so 10 slow batches each show it; every batch sleeps, so fewer batches wait less.
    config = write_config(tmp, "slow", model=str(model), strategy="one_device", global_batch_size=32, epochs=2,
                          steps_per_epoch=10, validation_steps=2, input_report=True)
    result = run(["train", str(config)])
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp / "job-slow" / "metrics.json").read_text())["input_report"]
    assert report["input_bound"] is True, report
    assert "input-bound: the input pipeline alone gives" in result.stdout and "modelyard.training.data.pipeline" in result.stdout
    assert report["input_share"] >= 0.4
