"""One chunk, start to commit: read its rows, shape them, predict in batches, write the part.

Runs the same in a worker process and in the calling process (``workers=0``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from modelyard.batch import dense_chunk
from modelyard.batch.instances import Shaping, shape
from modelyard.batch.predictor import Predictor, RowFailure
from modelyard.batch.readers import BadRow, Chunk, RawJson, read_chunk
from modelyard.batch.readers.jsonl import parse as parse_json
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


def raw_batch(predictor: Predictor, raw: list[RawJson], echoes: list[bytes], path: str,
              results: list[bytes], errors: list[bytes]) -> None:
    """Unshaped JSON lines of a one-tensor model: the NumPy fast path (fastjson), else row by row."""
    answers = predictor.predict_dense([r.line for r in raw])
    if answers is not None:
        results.extend(result_line(echo, None, answer) for echo, answer in zip(echoes, answers))
        return
    batch: list[Any] = []
    meta: list[bytes] = []
    for item, echo in zip(raw, echoes):
        parsed = parse_json(item, path)
        if isinstance(parsed, BadRow):
            errors.append(error_line(parsed.echo, None, "INVALID_ARGUMENT", parsed.message))
        else:
            batch.append(parsed.instance)
            meta.append(echo)
    if batch:
        for echo, answer in zip(meta, predictor.predict(batch)):
            if isinstance(answer, RowFailure):
                errors.append(error_line(echo, None, answer.code, answer.message))
            else:
                results.append(result_line(echo, None, answer))


def _shaped(row: Any, shaping: Shaping, errors: list[bytes]) -> tuple[tuple[bytes, Any], Any] | None:
    """``((echo, key), instance for the model)`` of a read row, or None once its error line is written."""
    if isinstance(row, BadRow):
        errors.append(error_line(row.echo, None, "INVALID_ARGUMENT", row.message))
        return None
    try:
        key, instance = shape(row.instance, shaping)
    except ServingError as exc:
        errors.append(error_line(row.echo or orjson.dumps(row.instance), None, exc.code.name, exc.message))
        return None
    echo = row.echo if (row.echo is not None and shaping.identity) else orjson.dumps(instance)
    return (echo, key), instance


def _predict_rows(predictor: Predictor, batch: list[Any], meta: list[tuple[bytes, Any]], results: list[bytes],
                  errors: list[bytes]) -> None:
    if not batch:
        return  # every row of it was refused before the model
    for (echo, key), answer in zip(meta, predictor.predict(batch)):
        if isinstance(answer, RowFailure):
            errors.append(error_line(echo, key, answer.code, answer.message))
        else:
            results.append(result_line(echo, key, answer))


def keyed_batch(shaping: Shaping) -> dense_chunk.RawBatch:
    """The general loop for a batch of object lines with a ``key_field`` that the C path refused."""
    def run(predictor: Predictor, raw: list[RawJson], echoes: list[bytes], path: str, results: list[bytes],
            errors: list[bytes]) -> None:
        batch: list[Any] = []
        meta: list[tuple[bytes, Any]] = []
        for item in raw:
            shaped = _shaped(parse_json(item, path), shaping, errors)
            if shaped is not None:
                meta.append(shaped[0])
                batch.append(shaped[1])
        _predict_rows(predictor, batch, meta, results, errors)
    return run


def _key_only(shaping: Shaping) -> bool:
    return (shaping.key_field is not None and not shaping.included_fields and not shaping.excluded_fields
            and shaping.instance_type in (None, "object"))


def process_chunk(job_dir: Path, chunk: Chunk, fmt: str, context: Any, shaping: Shaping,
                  predictor: Predictor, batch_size: int,
                  report: dense_chunk.Report | None = None) -> tuple[int, int] | None:
    """Predict every row of ``chunk`` and commit its part; returns ``(successes, failures)``.

    With ``report``, the outcome goes there instead (``(successes, failures)`` once committed, or
    the error), and the C path returns before its last writes and commit are done (a worker
    starts its next chunk meanwhile; ``part_writer.wait_finished()`` waits for them)."""
    # Unshaped JSON lines for a one-tensor model skip per-row parsing (fastjson) unless a batch fails.
    lazy = predictor.dense is not None and shaping.identity
    if fmt == "jsonl" and lazy and dense_chunk.available(predictor):
        return dense_chunk.process(job_dir, chunk, predictor, batch_size, raw_batch, report)
    # Object lines holding only a key and the model's input: the C path too, keys echoed as they are.
    if fmt == "jsonl" and _key_only(shaping) and dense_chunk.available(predictor, shaping.key_field):
        return dense_chunk.process(job_dir, chunk, predictor, batch_size, keyed_batch(shaping), report,
                                   key=shaping.key_field)
    results: list[bytes] = []
    errors: list[bytes] = []
    batch: list[Any] = []
    meta: list[tuple[bytes, Any]] = []
    raw: list[RawJson] = []
    raw_echo: list[bytes] = []

    def flush() -> None:
        _predict_rows(predictor, batch, meta, results, errors)
        batch.clear()
        meta.clear()

    def flush_raw() -> None:
        raw_batch(predictor, raw, raw_echo, chunk.label, results, errors)
        raw.clear()
        raw_echo.clear()

    for row in read_chunk(chunk, fmt, context):
        if not isinstance(row, BadRow) and isinstance(row.instance, RawJson):
            if lazy:
                raw.append(row.instance)
                raw_echo.append(row.echo)
                if len(raw) >= batch_size:
                    flush_raw()
                continue
            row = parse_json(row.instance, chunk.label)
        shaped = _shaped(row, shaping, errors)
        if shaped is None:
            continue
        meta.append(shaped[0])
        batch.append(shaped[1])
        if len(batch) >= batch_size:
            flush()
    if raw:
        flush_raw()
    if batch:
        flush()
    commit_part(job_dir, chunk.index, results, errors)
    if report is not None:
        report((len(results), len(errors)))
        return None
    return len(results), len(errors)
