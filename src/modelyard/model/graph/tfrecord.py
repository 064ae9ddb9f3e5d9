"""TFRecord files read without TensorFlow (TF Serving's warmup requests, ``assets.extra``).

Each record: its length (8 bytes, little-endian), the masked CRC32C of those 8 bytes, the data, the masked
CRC32C of the data. A record that is cut short or fails a check raises ``TFRecordError`` with the offset.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterator

from modelyard.model.graph.bundle import crc32c, unmask


class TFRecordError(Exception):
    """The file is not a whole, intact TFRecord file; the message says where."""


def records(path: str | Path) -> Iterator[bytes]:
    """The records of the TFRecord file at ``path``, in order."""
    data = Path(path).read_bytes()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise TFRecordError(f"truncated record at {pos} in {path}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack_from("<I", data, pos + 8)
        if unmask(header_crc) != crc32c(header):
            raise TFRecordError(f"corrupted record at {pos} in {path} (length checksum)")
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(data):
            raise TFRecordError(f"truncated record at {pos} in {path}")
        (data_crc,) = struct.unpack_from("<I", data, end)
        record = data[start:end]
        if unmask(data_crc) != crc32c(record):
            raise TFRecordError(f"corrupted record at {pos} in {path} (data checksum)")
        yield record
        pos = end + 4
