"""TFRecord files: each record (a serialized tf.Example, or any bytes) is one instance ``{"b64": ...}``.

The framing is TFRecord's (``modelyard.tfrecord_frames``: uint64 length, uint32 masked CRC of the
length, the data, uint32 masked CRC of the data). Length CRCs are checked while scanning, so a
truncated or corrupt file fails the plan with its offset instead of yielding garbage.

Split by probes (``probe``), a boundary is the first offset at or after the nominal one where a
whole record checks (its length's CRC and its data's CRC) and so do the ``CHAIN`` - 1 records after
it (or the file ends): bytes inside a record that look like a record, even whole TFRecords stored as
a record's data, are passed over, since the chain from them breaks where the outer record's data
CRC follows.
"""
from __future__ import annotations

import base64
from collections.abc import Iterator

import numpy as np
import orjson

from modelyard import tfrecord_frames
from modelyard.batch.readers.rows import BadRow, Row
from modelyard.batch.readers import split
from modelyard.batch.readers.source import PROBE, Source, opened
from modelyard.tfrecord_frames import FrameError, header_length

_HEADER = tfrecord_frames.HEADER
_SMALLEST = tfrecord_frames.OVERHEAD  # a record of no data
# Records that must check one after the other for a probe to take an offset as a record start: a
# record's data holding whole TFRecords passes the first checks, and its chain breaks where the outer
# record's data CRC follows. More than CHAIN whole records in a row inside one record's data would
# be taken for records (the only case a probe can place wrongly).
CHAIN = 8


def scan(file: str | Source, chunk_rows: int):
    return _ranges(opened(file), chunk_rows), None


def _length(head: bytes, path: str, where: str) -> int:
    """A record header's data length, its CRC checked: a bad one means a corrupt file (or not a TFRecord
    file at all), never a record to read past. ``where`` says where the header is, for the message."""
    length = header_length(head)
    if length is None:
        raise ValueError(f"{path}: corrupt TFRecord length at {where} (CRC mismatch); not a TFRecord file?")
    return length


def _ranges(source: Source, chunk_rows: int) -> Iterator[tuple[int, int, int]]:
    """Each range of ``chunk_rows`` records as soon as its last record's header is checked (headers
    are read through the source's read-ahead: one fetch per block, not per record)."""
    path, size = source.name, source.size
    chunk_start = pos = rows = 0
    while True:
        head = source.read(pos, _HEADER.size)
        if not head:
            break
        if len(head) < _HEADER.size:
            raise ValueError(f"{path}: truncated TFRecord header at byte {pos}")
        length = _length(head, path, f"byte {pos}")
        end = pos + _HEADER.size + length + 4
        if end > size:
            raise ValueError(f"{path}: truncated TFRecord data: the record at byte {pos} ends past the end of the file")
        pos = end
        rows += 1
        if rows == chunk_rows:
            yield chunk_start, pos, rows
            chunk_start, rows = pos, 0
    if rows:
        yield chunk_start, pos, rows


def _record_end(source: Source, pos: int) -> int | None:
    """The end of the record at ``pos`` if a whole one is there (length CRC and data CRC check), else None."""
    head = source.read(pos, _HEADER.size)
    if len(head) < _HEADER.size:
        return None
    length = header_length(head)
    if length is None or pos + _SMALLEST + length > source.size:
        return None
    body = source.read(pos + _HEADER.size, length + 4)
    return pos + _SMALLEST + length if tfrecord_frames.data_intact(body, 0, length) else None


def next_record_start(source: Source, pos: int) -> int:
    """The first record start at or after ``pos``: the first offset where a whole record checks and
    so does the next one (or the file ends with it), read window by window; the size when none."""
    size = source.size
    while pos + _SMALLEST <= size:
        data = source.peek(pos, least=_HEADER.size)
        window = np.frombuffer(data, np.uint8)
        n = len(window) - _HEADER.size + 1  # offsets whose header is whole in the window
        # A length that runs past the end rules an offset out: most offsets, without a CRC each.
        lengths = np.zeros(n, np.uint64)
        for b in range(8):
            lengths |= window[b:b + n].astype(np.uint64) << np.uint64(8 * b)
        room = (size - _SMALLEST - pos) - np.arange(n, dtype=np.int64)
        for i in np.flatnonzero(lengths.astype(np.float64) <= room.astype(np.float64)).tolist():
            if header_length(data[i:i + _HEADER.size]) is None:
                continue
            if _chain_holds(source, pos + i):
                return pos + i
        pos += n
    return size


def _chain_holds(source: Source, pos: int) -> bool:
    """Whether ``CHAIN`` whole records follow one another from ``pos`` (or fewer, ending the file)."""
    for _ in range(CHAIN):
        end = _record_end(source, pos)
        if end is None:
            return False
        if end == source.size:
            return True
        pos = end
    return True


def probe(source: Source, chunk_rows: int):
    """``scan`` by probes (``split``): the chunks' records are counted by whoever reads them. The
    headers of the first window are checked as ``scan`` checks them (a file that is not TFRecord
    fails here) and give the mean record size."""
    size = source.size
    if size == 0:
        return iter(()), None
    head = source.read(0, min(PROBE, size))
    records = pos = 0
    while pos < len(head):
        if pos + _HEADER.size > len(head) and records:
            break  # a header across the window's end: the records before it are enough
        if pos + _HEADER.size > size:
            raise ValueError(f"{source.name}: truncated TFRecord header at byte {pos}")
        piece = head[pos:pos + _HEADER.size] if pos + _HEADER.size <= len(head) else source.read(pos, _HEADER.size)
        length = _length(piece, source.name, f"byte {pos}")
        pos += _HEADER.size + length + 4
        if pos > size:
            raise ValueError(f"{source.name}: truncated TFRecord data: the record at byte "
                             f"{pos - _HEADER.size - length - 4} ends past the end of the file")
        records += 1
    return split.byte_ranges(source, chunk_rows, records, pos, next_record_start), None


def decode(data: bytes, context, path: str, first_row: int) -> list:
    rows: list = []
    try:
        # Every header checked here too: a chunk found by probes had only its first records' headers checked.
        for n, (_, record, intact) in enumerate(tfrecord_frames.walk(data)):
            instance = {"b64": base64.b64encode(record).decode("ascii")}
            if intact:
                rows.append(Row(instance, None))
            else:
                rows.append(BadRow(orjson.dumps(instance), f"{path} record {first_row + n + 1}: data CRC mismatch (corrupt record)"))
    except FrameError as exc:
        raise ValueError(_CHUNK_ERRORS[exc.kind].format(path=path, pos=exc.offset)) from None
    return rows


# How a chunk's FrameError reads in a job's error.
_CHUNK_ERRORS = {
    tfrecord_frames.TRUNCATED_HEADER: "{path}: truncated TFRecord header at byte {pos} of the chunk",
    tfrecord_frames.BAD_LENGTH: "{path}: corrupt TFRecord length at byte {pos} of the chunk (CRC mismatch); "
                                "not a TFRecord file?",
    tfrecord_frames.TRUNCATED_DATA: "{path}: the TFRecord record at byte {pos} of the chunk runs past its end "
                                    "(a truncated file?)",
}
