"""Input pipelines: built-in sources and a tf.data helper that follows the performance guide.

``pipeline()`` orders the steps the way tf.data's guide recommends: shard per worker
first (each worker reads only its part), parallel decode, cache after the expensive
decode, shuffle, repeat, parallel augmentation, batch per replica, prefetch with
AUTOTUNE so input overlaps compute. ``files_dataset()`` interleaves many files. Built-in sources: the scikit-learn digits (``source: digits``), ``.npz``,
``.csv`` (a ``label`` column, every other column a float feature) and TFRecord files of
``tf.train.Example`` (float feature ``x`` of ``shape``, int64 feature ``y``), local or ``gs://`` (uri_paths).

Every dataset function takes a ``tf.distribute.InputContext`` and yields per-replica
batches, which is what ``distribute_datasets_from_function`` and ParameterServerStrategy's
``DatasetCreator`` expect.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from modelyard.training import uri_paths


class DataError(ValueError):
    """The data section cannot be read; the message says what the source must look like."""


def _split_arrays(x: np.ndarray, y: np.ndarray, split: str, fraction: float, seed: int = 0):
    if fraction <= 0:  # the file holds this split whole: keep its order
        return x, y
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = int(round(len(x) * fraction))
    idx = order[:n_val] if split == "validation" else order[n_val:]
    return x[idx], y[idx]


def _npz(path: str):
    """``np.load`` of a local ``.npz`` or a ``gs://`` one (read whole: its index is at its end)."""
    if not uri_paths.is_uri(path):
        return np.load(path)
    import io

    with uri_paths.open_binary(path) as f:
        return np.load(io.BytesIO(f.read()))


def _load_npz(path: str, split: str, fraction: float):
    with _npz(path) as data:
        keys = set(data.files)
        prefix = "train" if split == "train" else "test"
        if {f"x_{prefix}", f"y_{prefix}"} <= keys:
            return data[f"x_{prefix}"], data[f"y_{prefix}"]
        if {"x", "y"} <= keys:
            return _split_arrays(data["x"], data["y"], split, fraction)
    raise DataError(f"data: {path} needs arrays x_train/y_train/x_test/y_test, or x/y; it has {sorted(keys)}")


def _load_csv(path: str, split: str, fraction: float, label: str):
    import csv

    with uri_paths.open_text(path) as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if not header or label not in header:
            raise DataError(f"data: {path} needs a header row with a {label!r} column (set data.label to change it)")
        rows = [row for row in reader if row]
    col = header.index(label)
    table = np.asarray(rows, dtype=np.float32)
    x = np.delete(table, col, axis=1)
    y = table[:, col].astype(np.int64)
    return _split_arrays(x, y, split, fraction)


def load_arrays(data: dict[str, Any], split: str) -> tuple[np.ndarray, np.ndarray]:
    """In-memory ``(x, y)`` for ``split`` ('train' or 'validation') of a digits/npz/csv source."""
    fraction = float(data.get("validation_fraction", 0.2))
    source = data.get(split) or data.get("source", "digits")
    if source == "digits":
        from modelyard.datasets import load_digits_28

        return load_digits_28("train" if split == "train" else "test")
    if not uri_paths.exists(source):
        raise DataError(f"data: {source} not found")
    own_file = bool(data.get(split))  # a file per split holds that split whole
    if source.endswith(".npz"):
        if own_file:
            with _npz(source) as arrays:
                return arrays[data.get("x_key", "x")], arrays[data.get("y_key", "y")]
        return _load_npz(source, split, fraction)
    if source.endswith(".csv"):
        return _load_csv(source, split, 0.0 if own_file else fraction, data.get("label", "label"))
    raise DataError(f"data: {source} is not a .npz or .csv file")


def shard_for(dataset, input_context):
    """Give this input pipeline (worker) only its share of ``dataset``."""
    if input_context is not None and input_context.num_input_pipelines > 1:
        return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset


def pipeline(
    dataset,
    batch_size: int,
    *,
    input_context=None,
    decode: Callable | None = None,
    augment: Callable | None = None,
    cache: bool = True,
    shuffle_buffer: int = 0,
    repeat: bool = True,
    seed: int | None = 0,
    num_parallel_calls: int | None = None,
    deterministic: bool = True,
):
    """Turn a dataset of examples into per-replica batches, tf.data-guide style.

    ``batch_size`` is per replica (``input_context.get_per_replica_batch_size(global)``).
    ``decode`` is the costly, deterministic per-example step (parse, decode an image):
    it runs in parallel and *before* the cache, so it runs once, not once per epoch.
    ``augment`` is the random step: it runs in parallel *after* the cache so every
    epoch sees fresh randomness. Both keep element order, so runs are reproducible;
    ``deterministic=False`` lets a slow element be overtaken (faster when per-example
    cost varies, e.g. reads from a network file system). ``num_parallel_calls`` defaults
    to AUTOTUNE, which tf.data bounds by the number of cores; a decode that mostly waits
    on I/O (and releases the GIL, if it is Python) can use more, e.g. 16.
    """
    import tensorflow as tf

    parallel = num_parallel_calls or tf.data.AUTOTUNE

    dataset = shard_for(dataset, input_context)
    if decode is not None:
        dataset = dataset.map(decode, num_parallel_calls=parallel, deterministic=deterministic)
    if cache:
        dataset = dataset.cache()
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    if augment is not None:
        dataset = dataset.map(augment, num_parallel_calls=parallel, deterministic=deterministic)
    # drop_remainder keeps every step the same shape on every replica, which
    # collectives need and which avoids a retrace for the last batch.
    dataset = dataset.batch(batch_size, drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def files_dataset(pattern: str | list[str], reader: Callable, *, input_context=None, cycle_length: int | None = None):
    """Read many files in parallel: shard the file list per worker, then interleave readers."""
    import tensorflow as tf

    files = uri_paths.glob(pattern) if isinstance(pattern, str) else list(pattern)
    if not files:
        raise DataError(f"data: no files match {pattern}")
    names = tf.data.Dataset.from_tensor_slices(files)
    if input_context is not None and input_context.num_input_pipelines > 1 and len(files) >= input_context.num_input_pipelines:
        names = names.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        input_context = None  # already sharded by file; do not shard examples again
    dataset = names.interleave(
        reader, cycle_length=cycle_length or tf.data.AUTOTUNE, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    return shard_for(dataset, input_context)


def _tfrecord_parser(data: dict[str, Any]):
    import tensorflow as tf

    shape = data.get("shape")
    if not shape:
        raise DataError("data: TFRecord sources need data.shape, the shape of one example's `x` feature")
    x_key, y_key = data.get("x_key", "x"), data.get("y_key", "y")
    spec = {
        x_key: tf.io.FixedLenFeature([int(np.prod(shape))], tf.float32),
        y_key: tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return tf.reshape(example[x_key], shape), example[y_key]

    return parse


def count_examples(data: dict[str, Any], split: str) -> int | None:
    """Number of examples in ``split`` for in-memory sources; None for TFRecord."""
    source = data.get(split) or data.get("source", "digits")
    if str(source).endswith((".tfrecord", ".tfrecords")) or "*" in str(source):
        return None
    return len(load_arrays(data, split)[1])


def builtin_dataset_fn(data: dict[str, Any], split: str, global_batch_size: int, seed: int | None):
    """A ``fn(input_context) -> dataset`` for the configured built-in source."""
    import tensorflow as tf

    source = data.get(split) or data.get("source", "digits")
    training = split == "train"
    shuffle = int(data.get("shuffle_buffer", 0)) if training else 0
    cache = bool(data.get("cache", True))
    if str(source).endswith((".tfrecord", ".tfrecords")) or "*" in str(source):
        parse = _tfrecord_parser(data)

        def tfrecord_fn(input_context=None):
            batch = input_context.get_per_replica_batch_size(global_batch_size) if input_context else global_batch_size
            examples = files_dataset(str(source), tf.data.TFRecordDataset, input_context=input_context)
            return pipeline(examples, batch, decode=parse, cache=cache, shuffle_buffer=shuffle, seed=seed)

        return tfrecord_fn
    x, y = load_arrays(data, split)

    def arrays_fn(input_context=None):
        batch = input_context.get_per_replica_batch_size(global_batch_size) if input_context else global_batch_size
        examples = tf.data.Dataset.from_tensor_slices((x, y))
        return pipeline(examples, batch, input_context=input_context, cache=cache, shuffle_buffer=shuffle, seed=seed)

    return arrays_fn
