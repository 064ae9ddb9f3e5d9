"""A JSONL chunk of one fixed-shape numeric tensor per line, through the C helper ``_denselines``.

The general loop (``work.process_chunk``) makes Python objects per row: a line, a row, an
echo, a result line. Here a chunk is mapped from the page cache, each batch of
``batch_size`` lines is parsed by C straight into one array (``_denselines.parse_u8`` for
integers from 0 to 255, 64 bytes at a time; else ``_denselines.parse``), the model runs, and C
writes the batch's output lines from the input's bytes and one ``orjson`` dump of the whole
prediction array (``_denselines.assemble``) into the buffer of a ``PartWriter``, which streams
them to a temporary part file renamed at commit, so a chunk's results are never all in memory.

Same bytes as the general loop, by construction: the batches are the same lines (the model
sees the same arrays), the C parser takes only lines whose values the NumPy fast path reads
identically, and any batch it refuses, or the model refuses, goes through ``work.raw_batch``,
the general loop's own code for a batch of raw lines.
"""
from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from modelyard.batch.predictor import Predictor
from modelyard.batch.readers import Chunk, RawJson, check_rows
from modelyard.batch.part_writer import PartWriter
from modelyard.batch.readers.lines import split_lines
from modelyard.batch.shards import commit_streamed, results_tmp
from modelyard.errors import ServingError

try:
    from modelyard.batch import _denselines
except ImportError:  # built without a C compiler: the general loop does the work
    _denselines = None
try:  # object lines ({"id": 7, "image": [...]}) taken apart for the dense readers
    from modelyard.batch import _keyedlines
except ImportError:
    _keyedlines = None

KEY_HEAD = b'{"key":'

RawBatch = Callable[[Predictor, list[RawJson], list[bytes], str, list[bytes], list[bytes]], None]
Report = Callable[["tuple[int, int] | BaseException"], None]


class _Buffers:
    """Buffers kept across chunks: a worker reuses memory it has already touched (no page faults)."""

    def __init__(self) -> None:
        self.values = np.empty(0, np.int64)
        self.u8 = np.empty(0, np.uint8)
        self.spans = np.empty(0, np.int64)
        self.echoes = np.empty(0, np.int64)  # object lines: the spans echoed (keys, or whole lines)
        self.arrays = bytearray()  # object lines: their arrays, one per line; grown as pluck asks

    def sized(self, values: int, rows: int) -> None:
        if self.values.size < values:
            self.values = np.empty(values, np.int64)
        if self.u8.size < values + 64:  # parse_u8 stores 64 bytes at a time
            self.u8 = np.empty(values + 64, np.uint8)
        if self.spans.size < 2 * rows:
            self.spans = np.empty(2 * rows, np.int64)
            self.echoes = np.empty(2 * rows, np.int64)


_LOCAL = threading.local()  # one set per thread: jobs run with workers=0 may share a process


def _buffers() -> _Buffers:
    found = getattr(_LOCAL, "buffers", None)
    if found is None:
        found = _LOCAL.buffers = _Buffers()
    return found


def available(predictor: Predictor, key: str | None = None) -> bool:
    """Whether this process can take the C path for ``predictor``'s JSON lines (object lines
    carrying ``key`` need ``_keyedlines`` too)."""
    return (_denselines is not None and predictor.dense is not None and predictor.dense.size > 0
            and (key is None or _keyedlines is not None))


def _objects(data: memoryview) -> bool:
    """Whether a chunk's lines are objects (judged by its first line: a batch that differs fails)."""
    head = bytes(data[:64]).lstrip(b" \t\r\n")
    return head.startswith(b"{") and _keyedlines is not None


def _map(chunk: Chunk) -> memoryview:
    """The chunk's bytes, mapped from the page cache (no copy: reading them costs no more than parsing)."""
    with open(chunk.read_path, "rb") as f:
        stop = min(chunk.end, os.fstat(f.fileno()).st_size)  # a file cut short since the plan: check_rows words it
        if stop <= chunk.start:
            return memoryview(b"")
        base = chunk.start - chunk.start % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(f.fileno(), stop - base, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ, offset=base)
    return memoryview(mapped)[chunk.start - base:]


def process(job_dir: Path, chunk: Chunk, predictor: Predictor, batch_size: int,
            raw_batch: RawBatch, report: Report | None = None, key: str | None = None) -> tuple[int, int] | None:
    """Predict every line of ``chunk`` and commit its part; returns ``(successes, failures)``.

    Lines are arrays, or objects naming the model's input (and ``key``, carried to the output
    as Vertex's ``key``, when given); ``raw_batch`` predicts a batch the C readers refuse.
    With ``report``, returns None once every line is predicted: the part writer's thread writes
    the rest, commits, then calls ``report((successes, failures))``, or ``report(error)``."""
    dense = predictor.dense
    buffers = _buffers()
    data = _map(chunk)
    objects = _objects(data) or key is not None
    buffers.sized(batch_size * dense.size, batch_size)
    pluck = (key.encode() if key is not None else None, dense.alias.encode()) if objects else None
    ok_count, errors, row = 0, [], 0
    tmp = results_tmp(job_dir, chunk.index)
    out = PartWriter(tmp)
    # The uint8 reader first (images); once it refuses a batch (floats, larger integers), the chunk
    # is not of that kind and the general reader takes the rest without a second attempt per batch.
    small_ints = dense.dtype.kind in "iuf"
    try:
        pos, end = 0, len(data)
        while pos < end:
            if pluck is None:
                n, after, batch, small_ints = _parse(data, pos, end, dense, buffers, batch_size, small_ints)
                echoes, head = buffers.spans, None
            else:
                n, after, batch, small_ints = _parse_objects(data, pos, end, dense, buffers, batch_size, small_ints,
                                                             *pluck)
                echoes, head = buffers.echoes, (KEY_HEAD if key is not None else None)
            if batch is None or not _predict(predictor, data, batch, echoes, n, out, head):
                # The batch as the general loop would take it: its lines, numbered within the file.
                lines = split_lines(bytes(data[pos:after]))
                raw = [RawJson(line, chunk.row_base + row + i + 1) for i, line in enumerate(lines)]
                results: list[bytes] = []
                raw_batch(predictor, raw, [line.strip() for line in lines], chunk.label, results, errors)
                if results:
                    out.write(b"\n".join(results) + b"\n")
                ok_count += len(results)
            else:
                ok_count += n
            row += n
            pos = after
        check_rows(chunk, row)  # counted while parsing: a pass of its own would cost a tenth of the rest
        if report is not None:
            def commit() -> None:
                commit_streamed(job_dir, chunk.index, tmp, ok_count, errors)
                report((ok_count, len(errors)))

            def failed(exc: BaseException) -> None:
                tmp.unlink(missing_ok=True)
                report(exc)

            out.finish(commit, failed)
            return None
        out.close()
        commit_streamed(job_dir, chunk.index, tmp, ok_count, errors)
    except BaseException:
        out.abort()
        tmp.unlink(missing_ok=True)
        raise
    return ok_count, len(errors)


def _parse(data: memoryview, pos: int, end: int, dense, buffers: _Buffers, batch_size: int,
           small_ints: bool) -> tuple[int, int, np.ndarray | None, bool]:
    """Up to ``batch_size`` lines from ``pos``: ``(lines, next pos, the model's input batch or None,
    whether to try the uint8 reader next time)``.

    With ``small_ints``, integers from 0 to 255 (images) take the uint8 reader, which skips the int64
    buffer and the cast; a batch it refuses takes the general reader, which also reads floats and
    larger integers.
    """
    # The values become the input's dtype by dtypes' rule (dense.fit): a batch with a value out of
    # the input's range (300, or 200 for an int8) goes to the general loop, which refuses that row.
    if small_ints:
        ok, n, after = _denselines.parse_u8(data, pos, end, batch_size, dense.shape, buffers.u8, buffers.spans)
        if ok:
            batch = dense.fit(buffers.u8[:n * dense.size])
            return n, after, None if batch is None else batch.reshape((n,) + dense.shape), True
    integer = dense.parse_dtype is np.int64
    ok, n, after = _denselines.parse(data, pos, end, batch_size, dense.shape, integer, buffers.values, buffers.spans,
                                     dense.integral)
    if not ok:
        return n, after, None, False
    values = buffers.values if integer else buffers.values.view(np.float64)
    batch = dense.fit(values[:n * dense.size])
    return n, after, None if batch is None else batch.reshape((n,) + dense.shape), False


def _parse_objects(data: memoryview, pos: int, end: int, dense, buffers: _Buffers, batch_size: int,
                   small_ints: bool, key: bytes | None, name: bytes) -> tuple[int, int, np.ndarray | None, bool]:
    """``_parse`` for object lines: ``_keyedlines.pluck`` copies each line's array into
    ``buffers.arrays`` (and its echo span into ``buffers.echoes``), which ``_parse`` then reads."""
    ok, n, after, used = _keyedlines.pluck(data, pos, end, batch_size, key, name, buffers.arrays, buffers.echoes)
    if used < 0:  # the arrays did not fit: room for the batch's bytes, and once more
        buffers.arrays = bytearray(-used)
        ok, n, after, used = _keyedlines.pluck(data, pos, end, batch_size, key, name, buffers.arrays, buffers.echoes)
    if not ok:
        return n, after, None, small_ints
    arrays = memoryview(buffers.arrays)[:used]
    parsed, _after, batch, small_ints = _parse(arrays, 0, used, dense, buffers, batch_size, small_ints)
    return n, after, batch if parsed == n else None, small_ints


def _predict(predictor: Predictor, data: memoryview, batch: np.ndarray, spans: np.ndarray, n: int,
             out: PartWriter, head: bytes | None = None) -> bool:
    """Write the output lines of a parsed batch of ``n`` rows to ``out`` (``spans``: the bytes echoed
    after ``head``); False when the model refuses it."""
    dense = predictor.dense
    try:
        encoded = predictor.encode_batch(predictor.servable.run(predictor.signature, {dense.alias: batch},
                                                                predictor.aliases), n)
    except ServingError:
        return False  # the general loop splits the batch and words each row's error
    written = _denselines.assemble(data, spans, n, encoded, out.buffer, out.offset, head)
    if written < 0:
        out.room(-written)
        written = _denselines.assemble(data, spans, n, encoded, out.buffer, out.offset, head)
    out.offset = written
    return True
