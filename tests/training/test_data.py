"""Built-in data sources and the tf.data helper (in-process, small)."""
from __future__ import annotations

import numpy as np
import pytest

import modelyard  # noqa: F401  (TF environment before TensorFlow)
from modelyard.training import data

pytestmark = pytest.mark.timeout(120)


def _context(pipelines: int, index: int, replicas: int):
    import tensorflow as tf

    return tf.distribute.InputContext(pipelines, index, replicas)


def _first(dataset):
    x, y = next(iter(dataset))
    return x.numpy(), y.numpy()


def test_digits_source_batches_per_replica_and_shards_per_worker():
    fn = data.builtin_dataset_fn({"source": "digits"}, "train", global_batch_size=64, seed=0)
    x0, y0 = _first(fn(_context(2, 0, 2)))
    x1, y1 = _first(fn(_context(2, 1, 2)))
    assert x0.shape == (32, 28, 28) and x0.dtype == np.uint8
    full_x, full_y = data.load_arrays({"source": "digits"}, "train")
    # Worker 0 reads examples 0, 2, 4...; worker 1 reads 1, 3, 5...: together one global batch.
    assert np.array_equal(y0, full_y[0:64:2]) and np.array_equal(y1, full_y[1:64:2])
    assert data.count_examples({"source": "digits"}, "train") == len(full_y)


def test_npz_and_csv_sources(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.random((50, 4)).astype(np.float32), rng.integers(0, 3, 50)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    train_x, train_y = data.load_arrays({"source": str(tmp_path / "d.npz"), "validation_fraction": 0.2}, "train")
    val_x, _ = data.load_arrays({"source": str(tmp_path / "d.npz"), "validation_fraction": 0.2}, "validation")
    assert len(train_x) == 40 and len(val_x) == 10 and train_x.shape[1] == 4
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,label\n" + "\n".join(f"{i},{i * 2},{i % 2}" for i in range(10)) + "\n")
    cx, cy = data.load_arrays({"train": str(csv)}, "train")
    assert cx.shape == (10, 2) and list(cy[:3]) == [0, 1, 0]
    with pytest.raises(data.DataError, match="'target' column"):
        data.load_arrays({"train": str(csv), "label": "target"}, "train")


def test_tfrecord_source(tmp_path):
    import tensorflow as tf

    for shard in range(2):
        with tf.io.TFRecordWriter(str(tmp_path / f"part-{shard}.tfrecord")) as writer:
            for i in range(8):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i)] * 6)),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
                }))
                writer.write(example.SerializeToString())
    spec = {"source": str(tmp_path / "*.tfrecord"), "shape": [2, 3]}
    fn = data.builtin_dataset_fn(spec, "train", global_batch_size=4, seed=0)
    x, y = _first(fn(None))
    assert x.shape == (4, 2, 3) and y.shape == (4,)
    assert data.count_examples(spec, "train") is None
    with pytest.raises(data.DataError, match="data.shape"):
        data.builtin_dataset_fn({"source": spec["source"]}, "train", 4, 0)


def test_pipeline_decodes_once_and_augments_every_epoch():
    import tensorflow as tf

    calls = {"decode": 0}

    def count(value):
        calls["decode"] += 1
        return value

    def decode(value):
        return tf.numpy_function(count, [value], tf.int64, stateful=True)

    ds = data.pipeline(tf.data.Dataset.range(8), 4, decode=decode, augment=lambda v: v * 10, repeat=True)
    values = [int(v) for batch in ds.take(6) for v in batch.numpy()]  # three passes over 8 examples
    assert values[:8] == [v * 10 for v in range(8)] and values[8:16] == values[:8]
    assert calls["decode"] == 8  # cached after decode


def test_learning_rate_scaling_and_warmup():
    import tf_keras as keras

    from modelyard.training.progress import WarmupAndScaling

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: seen.append(float(keras.backend.get_value(model.optimizer.learning_rate))))
    x, y = np.zeros((8, 2), np.float32), np.zeros((8, 1), np.float32)
    model.fit(x, y, batch_size=2, epochs=2, verbose=0, callbacks=[WarmupAndScaling(4.0, 1, 4), record])
    # lr 0.1 scaled x4 = 0.4, reached linearly over the first epoch (4 steps), then held.
    assert np.allclose(seen, [0.1, 0.2, 0.3, 0.4, 0.4, 0.4, 0.4, 0.4], atol=1e-6)


def test_collective_watchdog_fires_only_when_steps_stop(monkeypatch):
    import time

    import tf_keras as keras

    from modelyard.training.watchdog import CollectiveWatchdog

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    watchdog = CollectiveWatchdog(0.6, "worker:0", poll=0.1)
    stalls: list[float] = []
    monkeypatch.setattr(watchdog, "abort", stalls.append)  # record instead of aborting collectives
    watchdog.set_model(model)
    watchdog.on_train_begin()
    try:
        for _ in range(12):  # steps keep completing: no abort however long it runs
            model._train_counter.assign_add(1)
            time.sleep(0.1)
        assert stalls == []
        time.sleep(1.5)  # steps stop
        assert len(stalls) == 1 and stalls[0] >= 0.6
    finally:
        watchdog.stop()
