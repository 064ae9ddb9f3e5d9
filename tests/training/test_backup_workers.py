"""Synchronous parameter-server training with backup workers (issue 18), on a real cluster of
processes started by ``modelyard launch``: a stalled worker's gradients are not waited for
and arrive too late to be applied; a killed worker does not stop the job.
"""
from __future__ import annotations

import json
import sys
import os
import queue
import signal

import pytest

from modelyard.training import config as config_mod
from modelyard.training import ps_training
from tests.training.conftest import ENV, Launched, write_config
from tests.warm_process import run_python


@pytest.mark.timeout(300)
def test_a_stalled_worker_is_not_waited_for_and_a_killed_one_does_not_stop_training(tmp_path):
    steps = 40
    config = write_config(tmp_path, "backup", strategy={"name": "parameter_server", "backup_workers": 1},
                          global_batch_size=64, epochs=4, steps_per_epoch=steps, validation_steps=5)
    # The tasks are forked warm (launch's default): each worker's gradients are credited to it by the
    # index it exposes (ps_training.expose_task), which its /proc/self/environ does not carry.
    job = Launched(["launch", "--workers", "3", "--ps", "1", "--", sys.executable, "-m", "modelyard", "train",
                    str(config)], tmp_path / "launch.log")
    try:
        pid = int(job.wait_for(r"^worker:2 \| \[modelyard\] started pid (\d+)", 60).group(1))
        job.wait_for(r"^chief:0 \| epoch 1/4 ", 180)
        os.killpg(pid, signal.SIGSTOP)  # worker 2 stalls: it keeps its connections but computes nothing
        try:
            job.wait_for(r"^chief:0 \| epoch 2/4 ", 120)  # a whole epoch passes without it
        finally:
            os.killpg(pid, signal.SIGCONT)
        job.wait_for(r"^chief:0 \| epoch 3/4 ", 120)
        os.killpg(pid, signal.SIGKILL)  # now it dies: the launcher restarts it, training goes on
        job.wait_for(r"^worker:2 \| \[modelyard\] exited with code -9 \(killed by SIGKILL\); restarting it in place", 60)
        job.wait_for(r"job finished", 180)
        assert job.proc.wait(30) == 0
    finally:
        job.stop()
    metrics = json.loads((tmp_path / "job-backup" / "metrics.json").read_text())
    assert metrics["completed"] and metrics["gradients_per_step"] == 2 and metrics["epochs_completed"] == 4
    epochs = metrics["epochs"]
    for epoch in epochs:
        assert epoch["applied"] == 2 * steps  # every step applied exactly N fresh gradients
    # Epoch 2 ran while worker 2 was stopped: (nearly) nothing of it was applied; what it had in
    # flight came back computed on old weights and was dropped, never applied.
    assert epochs[1]["applied_by_worker"].get("2", 0) <= 1, epochs[1]
    assert sum(e["dropped_by_worker"].get("2", 0) for e in epochs[1:3]) >= 1, epochs
    assert epochs[-1]["val_accuracy"] >= 0.85


class _ScriptedCoordinator:
    """Stands in for TF's ClusterCoordinator: each scheduled computation's fetch follows the script."""

    def __init__(self, outcomes: list):
        self.outcomes, self.scheduled = list(outcomes), 0

    def schedule(self, fn, args):
        outcome = self.outcomes.pop(0)
        self.scheduled += 1
        return _ScriptedRemote(outcome)


class _ScriptedRemote:
    def __init__(self, outcome):
        self.outcome = outcome

    def fetch(self):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def _scripted_source(outcomes: list) -> ps_training.GradientSource:
    source = object.__new__(ps_training.GradientSource)  # no cluster: only the scheduling is under test
    source.coordinator, source._compute, source.iterator = _ScriptedCoordinator(outcomes), None, None
    source.results, source.in_flight = queue.Queue(), 0
    return source


def _unavailable():
    import tensorflow as tf

    return tf.errors.UnavailableError(None, None, "failed to connect to all addresses")


def test_a_result_lost_with_its_worker_after_computing_is_computed_again():
    # CI once saw the chief fail this way: worker 2 finished a computation and was killed before
    # the coordinator copied its outputs, and the fetch raised UnavailableError.
    source = _scripted_source([_unavailable(), (3, 1, 0.5, ["g"])])
    source.launch()
    assert source.next() == (3, 1, 0.5, ["g"])
    assert source.coordinator.scheduled == 2 and source.in_flight == 0


def test_a_synchronous_step_completes_when_one_of_its_results_is_lost():
    # The loop the CI failure struck: two workers, no backup, one of the step's two results lost.
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    model = keras.Sequential([keras.layers.Dense(1, input_shape=(2,))])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.optimizer.build(model.trainable_variables)
    before = [v.numpy().copy() for v in model.trainable_variables]
    grads = [np.ones_like(v) for v in before]
    source = _scripted_source([_unavailable(), (0, 0, 1.0, grads), (0, 1, 3.0, grads)])
    source.step = tf.Variable(0, dtype=tf.int64)
    stats = ps_training.EpochStats()
    loss = ps_training.SyncTrainer(source, model, workers=2, backup_workers=0).train_step(stats)
    assert loss == 2.0 and int(source.step.numpy()) == 1 and source.coordinator.scheduled == 3
    assert dict(stats.applied) == {0: 1, 1: 1} and not stats.dropped
    for old, new in zip(before, model.trainable_variables):
        np.testing.assert_allclose(new.numpy(), old - 0.1)  # the mean of the two fresh gradients, applied once


def test_results_lost_without_end_fail_the_step_and_other_errors_are_not_retried():
    import tensorflow as tf

    source = _scripted_source([_unavailable()] * (ps_training.MAX_LOST_IN_A_ROW + 1))
    source.launch()
    with pytest.raises(tf.errors.UnavailableError):
        source.next()
    assert source.coordinator.scheduled == ps_training.MAX_LOST_IN_A_ROW + 1
    source = _scripted_source([tf.errors.InvalidArgumentError(None, None, "bad batch")])
    source.launch()
    with pytest.raises(tf.errors.InvalidArgumentError, match="bad batch"):
        source.next()
    assert source.coordinator.scheduled == 1


@pytest.mark.parametrize("strategy, message", [
    ({"name": "multi_worker_mirrored", "backup_workers": 1}, "backup workers are a parameter-server technique"),
    ({"name": "parameter_server", "backup_workers": -1}, "strategy.backup_workers: must be an integer >= 0"),
])
def test_backup_workers_outside_parameter_server_are_refused(tmp_path, strategy, message):
    with pytest.raises(config_mod.ConfigError, match=message):
        config_mod.load(write_config(tmp_path, "bad", strategy=strategy))


def test_as_many_backup_workers_as_workers_is_refused(tmp_path):
    config = write_config(tmp_path, "all", strategy={"name": "parameter_server", "backup_workers": 2},
                          global_batch_size=64, epochs=1, steps_per_epoch=2)
    job = Launched(["launch", "--workers", "2", "--ps", "1", "--", sys.executable, "-m", "modelyard", "train", str(config)],
                   tmp_path / "launch.log")
    try:
        job.wait_for(r"strategy.backup_workers 2 leaves no worker whose gradient is waited for \(2 workers\)", 120)
        assert job.proc.wait(60) != 0
    finally:
        job.stop()
    assert not [line for line in job.all_lines(10) if "started pid" in line], job.lines  # refused before any task started


def test_each_parameter_server_worker_reads_its_own_batches(tmp_path):
    """Every worker runs one trace of the dataset function and its input context says "pipeline 0
    of 1": without distinct_per_worker they would all read the same batches. Each process here has
    the TF_CONFIG `modelyard launch` gives worker i, and exposes it as a serving task does before its
    server starts (ps_training.expose_task); the index is read from the process itself. The processes
    are forked from a warm interpreter, as launch's tasks are: their /proc/self/environ is the
    interpreter's, without their TF_CONFIG (read from there, every worker was index 0)."""
    script = (
        "import tensorflow as tf\n"
        "import json, os\n"
        "from modelyard.training.ps_training import distinct_per_worker, expose_task\n"
        "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
        "expose_task(task['type'], task['index'])\n"
        "fn = distinct_per_worker(lambda ctx: tf.data.Dataset.range(12).batch(1).repeat(), 3)\n"
        "print([int(b[0]) for b in fn(None).take(4)])\n"
    )
    (tmp_path / "reads.py").write_text(script)
    seen = []
    for index in range(3):
        tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:1", "c:1"], "ps": ["d:1"]},
                                "task": {"type": "worker", "index": index}})
        # A process of its own per worker (forked warm: tests/warm_process.py), as launch starts each.
        out = run_python([sys.executable, str(tmp_path / "reads.py")], {**ENV, "TF_CONFIG": tf_config}, 120)
        assert out.returncode == 0, out.stderr[-2000:]
        seen.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert seen == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
