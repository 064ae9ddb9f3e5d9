"""TFRecord's framing, the one place it is written down (the batch reader and the warmup reader use it).

A record: its data's length (uint64, little-endian), the masked CRC-32C of those 8 bytes (uint32), the
data, the masked CRC-32C of the data (uint32). ``walk`` reads a buffer of whole records; the readers
word its ``FrameError``s for their own callers (a batch job's plan, a model's warmup file).
"""
from __future__ import annotations

import struct
from collections.abc import Iterator

from modelyard.crc32c import masked_crc

HEADER = struct.Struct("<QI")  # the data's length, the masked CRC of those 8 bytes
TRAILER = struct.Struct("<I")  # the masked CRC of the data
OVERHEAD = HEADER.size + TRAILER.size  # what a record adds to its data: 16 bytes

# FrameError kinds: where a buffer stops being whole records.
TRUNCATED_HEADER = "truncated header"  # fewer than HEADER.size bytes left
BAD_LENGTH = "bad length"  # the length's CRC does not check: corrupt, or not a TFRecord file
TRUNCATED_DATA = "truncated data"  # the length runs past the buffer's end


class FrameError(ValueError):
    """The buffer is not whole records from ``offset`` on; ``kind`` says why (one of the kinds above)."""

    def __init__(self, kind: str, offset: int) -> None:
        super().__init__(f"{kind} at byte {offset}")
        self.kind, self.offset = kind, offset


def header_length(header: bytes) -> int | None:
    """The data length a record header (``HEADER.size`` bytes) holds, or None when its CRC does not check."""
    length, length_crc = HEADER.unpack(header)
    return length if masked_crc(header[:8]) == length_crc else None


def data_intact(buf: bytes, start: int, length: int) -> bool:
    """Whether the ``length`` bytes of data at ``start`` match the masked CRC stored right after them."""
    return masked_crc(buf[start:start + length]) == TRAILER.unpack_from(buf, start + length)[0]


def frame(data: bytes) -> bytes:
    """``data`` as one record, framed as TensorFlow's ``TFRecordWriter`` frames it (uncompressed)."""
    length = struct.pack("<Q", len(data))
    return length + TRAILER.pack(masked_crc(length)) + data + TRAILER.pack(masked_crc(data))


def walk(buf: bytes) -> Iterator[tuple[int, bytes, bool]]:
    """``(offset, data, intact)`` for each record of ``buf`` in order: ``intact`` is whether the data's CRC
    checks (the caller decides what a corrupt record costs). Raises ``FrameError`` where a header is cut
    short, a length's CRC fails or a record runs past the end: nothing after that point can be framed."""
    if not isinstance(buf, bytes):
        buf = bytes(buf)  # google-crc32c takes bytes only; one copy of the buffer, not one per record
    size, pos = len(buf), 0
    unpack_header, unpack_trailer = HEADER.unpack_from, TRAILER.unpack_from
    while pos < size:
        if pos + HEADER.size > size:
            raise FrameError(TRUNCATED_HEADER, pos)
        length, length_crc = unpack_header(buf, pos)
        if masked_crc(buf[pos:pos + 8]) != length_crc:
            raise FrameError(BAD_LENGTH, pos)
        start = pos + HEADER.size
        end = start + length
        if end + TRAILER.size > size:
            raise FrameError(TRUNCATED_DATA, pos)
        data = buf[start:end]
        yield pos, data, masked_crc(data) == unpack_trailer(buf, end)[0]
        pos = end + TRAILER.size
