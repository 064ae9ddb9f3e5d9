"""One chunk, start to commit: read its rows, shape them, predict in batches, write the part.

Runs the same in a worker process and in the calling process (``workers=0``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from modelyard.batch.instances import Shaping, shape
from modelyard.batch.predictor import Predictor, RowFailure
from modelyard.batch.readers import BadRow, Chunk, read_chunk
from modelyard.batch.shards import commit_part
from modelyard.errors import ServingError


def error_line(echo: bytes, key: Any, status: str, message: str) -> bytes:
    head = b'{"key":' + orjson.dumps(key) + b',' if key is not None else b"{"
    return (head + b'"instance":' + echo + b',"error":{"status":' + orjson.dumps(status)
            + b',"message":' + orjson.dumps(message) + b"}}")


def result_line(echo: bytes | None, key: Any, prediction: bytes) -> bytes:
    if key is not None:
        return b'{"key":' + orjson.dumps(key) + b',"prediction":' + prediction + b"}"
    return b'{"instance":' + echo + b',"prediction":' + prediction + b"}"


def process_chunk(job_dir: Path, chunk: Chunk, fmt: str, context: Any, shaping: Shaping,
                  predictor: Predictor, batch_size: int) -> tuple[int, int]:
    """Predict every row of ``chunk`` and commit its part; returns ``(successes, failures)``."""
    results: list[bytes] = []
    errors: list[bytes] = []
    batch: list[Any] = []
    meta: list[tuple[bytes, Any]] = []

    def flush() -> None:
        for (echo, key), answer in zip(meta, predictor.predict(batch)):
            if isinstance(answer, RowFailure):
                errors.append(error_line(echo, key, answer.code, answer.message))
            else:
                results.append(result_line(echo, key, answer))
        batch.clear()
        meta.clear()

    for row in read_chunk(chunk, fmt, context):
        if isinstance(row, BadRow):
            errors.append(error_line(row.echo, None, "INVALID_ARGUMENT", row.message))
            continue
        try:
            key, instance = shape(row.instance, shaping)
        except ServingError as exc:
            errors.append(error_line(row.echo or orjson.dumps(row.instance), None, exc.code.name, exc.message))
            continue
        echo = row.echo if (row.echo is not None and shaping.identity) else orjson.dumps(instance)
        batch.append(instance)
        meta.append((echo, key))
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    commit_part(job_dir, chunk.index, results, errors)
    return len(results), len(errors)
