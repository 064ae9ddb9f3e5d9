"""Asynchronous parameter-server training with staleness control (issue 18).

The policy is checked against a scripted schedule of worker delays, where the staleness of
every gradient is known in advance; then a real cluster (``modelyard launch``, three workers)
trains asynchronously: every arriving gradient's tau is counted, exactly those older than the
limit are dropped, and TensorBoard gets a histogram of tau per epoch.
"""
from __future__ import annotations

import heapq
import json
import sys

import numpy as np
import pytest

from modelyard.training import config as config_mod
from modelyard.training import ps_training
from tests.training.conftest import Launched, write_config


def _scripted_arrivals(delays: list[int], count: int, drop_older_than: int | None):
    """Workers taking ``delays[i]`` ticks per gradient, each starting again as soon as it is done.

    Returns ``(worker, read_step, tau, applied)`` for the first ``count`` arrivals in time order,
    where read_step is the number of updates applied when the worker started and tau the number
    applied since, by the definition (not by the code under test).
    """
    events = [(delay, worker, 0) for worker, delay in enumerate(delays)]  # (finish tick, worker, read step)
    heapq.heapify(events)
    updates, out = 0, []
    while len(out) < count:
        tick, worker, read_step = heapq.heappop(events)
        tau = updates - read_step
        applied = drop_older_than is None or tau <= drop_older_than
        updates += applied
        out.append((worker, read_step, tau, applied))
        heapq.heappush(events, (tick + delays[worker], worker, updates))
    return out


class _ScriptedSource:
    """Stands in for the cluster: the step counter lives here, gradients come from the script."""

    def __init__(self):
        import tensorflow as tf

        self.step = tf.Variable(0, dtype=tf.int64)
        self.in_flight = 0


@pytest.mark.parametrize("drop_older_than, scale", [(None, "none"), (2, "none"), (None, "inverse"), (1, "inverse")])
def test_measured_staleness_and_drops_follow_a_scripted_schedule(drop_older_than, scale):
    import tf_keras as keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    start = model.get_weights()[0].copy()
    trainer = ps_training.AsyncTrainer(_ScriptedSource(), model, 3,
                                       ps_training.StalenessPolicy(drop_older_than, scale))
    script = _scripted_arrivals([1, 1, 5], 40, drop_older_than)  # worker 2 is five times slower
    stats = ps_training.EpochStats()
    expected_weights = start.copy()
    for n, (worker, read_step, tau, applied) in enumerate(script):
        gradient = np.full((2, 1), n + 1.0, np.float32)  # each arrival distinct, so the sum shows which were applied
        assert trainer.arrive(read_step, worker, 0.0, [gradient], stats) == applied
        if applied:
            expected_weights -= 0.1 * gradient * (1.0 / max(tau, 1) if scale == "inverse" else 1.0)
    assert stats.staleness == [tau for _, _, tau, _ in script]
    assert max(stats.staleness) >= 4  # the slow worker's gradients are really stale
    assert sum(stats.dropped.values()) == sum(not a for *_, a in script)
    assert dict(stats.dropped) == {w: n for w in range(3)
                                   if (n := sum(1 for s in script if s[0] == w and not s[3]))}
    assert int(trainer.source.step.numpy()) == sum(a for *_, a in script)
    np.testing.assert_allclose(model.get_weights()[0], expected_weights, rtol=1e-5)


@pytest.mark.timeout(300)
def test_asynchronous_training_on_a_cluster_measures_tau_and_drops_exactly_the_stale(tmp_path):
    steps = 60
    config = write_config(tmp_path, "async", global_batch_size=32, epochs=3, steps_per_epoch=steps,
                          validation_steps=5, tensorboard=True,
                          strategy={"name": "parameter_server",
                                    "staleness": {"drop_older_than": 1, "single_replica_epochs": 1}})
    job = Launched(["launch", "--workers", "3", "--ps", "1", "--", sys.executable, "-m", "modelyard", "train", str(config)],
                   tmp_path / "launch.log")
    try:
        job.wait_for(r"job finished", 240)
        assert job.proc.wait(30) == 0
    finally:
        job.stop()
    metrics = json.loads((tmp_path / "job-async" / "metrics.json").read_text())
    assert metrics["mode"] == "asynchronous" and metrics["completed"]
    first, later = metrics["epochs"][0], metrics["epochs"][1:]
    assert first["staleness_max"] == 0 and first["dropped"] == 0  # one computation at a time: never stale
    for epoch in metrics["epochs"]:
        assert epoch["applied"] == steps
        counts = {int(tau): n for tau, n in epoch["staleness_counts"].items()}
        assert sum(counts.values()) == epoch["applied"] + epoch["dropped"]  # every arrival measured
        assert epoch["dropped"] == sum(n for tau, n in counts.items() if tau > 1)  # exactly those older than 1
    assert max(e["staleness_max"] for e in later) >= 1  # three workers at once: updates land in between
    assert later[-1]["val_accuracy"] >= 0.8
    events = list((tmp_path / "job-async" / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert events, "no TensorBoard events written"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(events[0].parent), size_guidance={"tensors": 0})
    accumulator.Reload()
    assert "staleness" in accumulator.Tags()["tensors"]
    assert len(accumulator.Tensors("staleness")) == 3  # one histogram per epoch


@pytest.mark.parametrize("strategy, message", [
    ({"name": "multi_worker_mirrored", "staleness": {}}, "staleness control is for asynchronous parameter-server"),
    ({"name": "parameter_server", "staleness": {}, "backup_workers": 1}, "choose one"),
    ({"name": "parameter_server", "staleness": {"scale": "sqrt"}}, "is not one of none, inverse"),
    ({"name": "parameter_server", "staleness": {"drop_older_than": -1}}, "drop_older_than: must be an integer >= 0"),
])
def test_bad_staleness_configs_are_refused(tmp_path, strategy, message):
    with pytest.raises(config_mod.ConfigError, match=message):
        config_mod.load(write_config(tmp_path, "bad", strategy=strategy))
