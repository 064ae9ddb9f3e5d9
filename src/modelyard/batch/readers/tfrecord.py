"""TFRecord files: each record (a serialized tf.Example, or any bytes) is one instance ``{"b64": ...}``.

The framing is TFRecord's: uint64 length, uint32 masked CRC of the length, the data, uint32
masked CRC of the data (little-endian). Length CRCs are checked while scanning, so a
truncated or corrupt file fails the plan with its offset instead of yielding garbage.
"""
from __future__ import annotations

import base64
import struct
from collections.abc import Iterator

import orjson

from modelyard.batch.readers.rows import BadRow, Row
from modelyard.batch.readers.crc32c import masked_crc
from modelyard.batch.readers.source import Source, opened

_HEADER = struct.Struct("<QI")


def scan(file: str | Source, chunk_rows: int):
    return _ranges(opened(file), chunk_rows), None


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
        length, length_crc = _HEADER.unpack(head)
        if masked_crc(head[:8]) != length_crc:
            raise ValueError(f"{path}: corrupt TFRecord length at byte {pos} (CRC mismatch); not a TFRecord file?")
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


def decode(data: bytes, context, path: str, first_row: int) -> list:
    rows: list = []
    view = memoryview(data)
    pos = n = 0
    while pos < len(data):
        length, _ = _HEADER.unpack_from(view, pos)
        start = pos + _HEADER.size
        record = bytes(view[start:start + length])
        (data_crc,) = struct.unpack_from("<I", view, start + length)
        pos = start + length + 4
        instance = {"b64": base64.b64encode(record).decode("ascii")}
        if masked_crc(record) != data_crc:
            rows.append(BadRow(orjson.dumps(instance), f"{path} record {first_row + n + 1}: data CRC mismatch (corrupt record)"))
        else:
            rows.append(Row(instance, None))
        n += 1
    return rows
