"""Splitting a file into chunks of whole lines by byte range, fast (4 MiB blocks; lines counted in C where built, else NumPy).

``quoted=True`` ignores newlines inside double quotes (CSV fields may hold newlines;
an escaped quote is two quotes, so the parity rule holds).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from modelyard.batch.readers import split
from modelyard.batch.readers.source import PROBE, Source, opened

try:  # 64 bytes at a time; NumPy's count makes a boolean array first (0.3 s more per 2 GB)
    from modelyard.batch._denselines import count_byte as _count_byte
except ImportError:  # the C helper is optional
    _count_byte = None


def _newlines(arr: np.ndarray) -> int:
    return _count_byte(arr, 10) if _count_byte is not None else int(np.count_nonzero(arr == 10))


def line_ranges(file: str | Source, chunk_rows: int, start: int = 0,
                quoted: bool = False) -> Iterator[tuple[int, int, int]]:
    """``(start, end, rows)`` ranges covering ``file`` from ``start`` (a last line without a newline
    counts), each as soon as its last line is found: a job's workers start on the first chunks
    while the rest of the file is still being counted (or, in object storage, still being read)."""
    source = opened(file)
    chunk_start, rows, odd = start, 0, 0
    size = source.size
    for pos, block in source.blocks(start):
        if not quoted:
            count = _newlines(block)
            if count < chunk_rows - rows:  # no chunk ends in this block (most blocks): a count will do
                rows += count
                continue
        newlines = np.flatnonzero(block == 10)
        if quoted:
            quotes = np.cumsum(block == 34, dtype=np.int64)
            newlines = newlines[(quotes[newlines] + odd) % 2 == 0]
            odd = (odd + int(quotes[-1])) % 2
        ends = newlines + (pos + 1)
        i = 0
        while len(ends) - i >= chunk_rows - rows:
            i += chunk_rows - rows
            end = int(ends[i - 1])
            yield chunk_start, end, chunk_rows
            chunk_start, rows = end, 0
        rows += len(ends) - i
    if size > start and source.read(size - 1, 1) != b"\n":
        rows += 1  # bytes after the last newline are one more row
    if rows:
        yield chunk_start, size, rows


def next_line_start(source: Source, pos: int) -> int:
    """The first line start at or after ``pos`` (> 0): the byte after the first newline at or after
    ``pos - 1``, read window by window (``Source.peek``); the size when there is none."""
    at = pos - 1
    while at < source.size:
        data = source.peek(at)
        found = data.find(b"\n")
        if found >= 0:
            return at + found + 1
        at += len(data)
    return source.size


def probe_ranges(source: Source, chunk_rows: int) -> Iterator[tuple[int, int, int]]:
    """``split.byte_ranges`` of a file of lines: about ``chunk_rows`` lines a chunk, by the mean line
    of the first window (for lines newlines alone tell where a row starts; quoted CSV cannot be split so)."""
    head = source.read(0, min(PROBE, source.size))
    newlines = head.count(b"\n")
    spanned = head.rindex(b"\n") + 1 if newlines else len(head)  # no newline: a line at least this long
    return split.byte_ranges(source, chunk_rows, newlines or 1, spanned, next_line_start)


def split_lines(data: bytes) -> list[bytes]:
    """The lines of a chunk, without their newlines (the final newline ends a line, not starts one)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def show(raw: bytes, limit: int = 200) -> str:
    text = raw.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "..."
