"""A SavedModel's variables read without TensorFlow: ``variables.index`` and ``variables.data-*``.

The index is a LevelDB-format table (TensorFlow's ``tsl/lib/io/table``): data blocks of prefix-compressed
key/value entries, an index block pointing at them, and a 48-byte footer ending in the table's magic
number. Its entries map checkpoint keys to ``BundleEntryProto`` (dtype, shape, shard, offset, size,
masked CRC32C); the empty key holds the ``BundleHeaderProto``. Every block and every tensor read is
checked against its CRC32C, so a truncated or corrupted checkpoint is refused rather than served.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from modelyard.crc32c import crc32c, unmask  # LevelDB's checksum and its mask, as TFRecord's
from modelyard.model import dtypes

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48


class BundleError(Exception):
    """The variables cannot be read; the message names the file and what is wrong."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise BundleError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _block(data: bytes, offset: int, size: int, where: str) -> bytes:
    """One block's contents, its trailer (compression type, masked CRC32C) checked."""
    if offset + size + 5 > len(data):
        raise BundleError(f"{where}: block at {offset} runs past the end of the file (truncated?)")
    contents = data[offset:offset + size]
    kind = data[offset + size]
    (stored,) = struct.unpack_from("<I", data, offset + size + 1)
    if unmask(stored) != crc32c(data[offset:offset + size + 1]):
        raise BundleError(f"{where}: block at {offset} fails its CRC32C check (corrupted)")
    if kind != 0:
        raise BundleError(f"{where}: block at {offset} is compressed (type {kind}); only uncompressed tables are read")
    return contents


def _entries(block: bytes, where: str):
    """The (key, value) pairs of one block, in order."""
    if len(block) < 4:
        raise BundleError(f"{where}: block too short")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 * (restarts + 1)
    pos, key = 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + length]
        pos += length


def read_table(path: Path) -> dict[bytes, bytes]:
    """Every key/value of the LevelDB-format table at ``path``."""
    data = path.read_bytes()
    if len(data) < _FOOTER_SIZE:
        raise BundleError(f"{path}: too short to be a tensor bundle index")
    footer = data[-_FOOTER_SIZE:]
    (magic,) = struct.unpack_from("<Q", footer, _FOOTER_SIZE - 8)
    if magic != _TABLE_MAGIC:
        raise BundleError(f"{path}: not a tensor bundle index (bad magic number)")
    _, pos = _varint(footer, 0)  # the metaindex block's handle: unused (no filters)
    _, pos = _varint(footer, pos)
    index_offset, pos = _varint(footer, pos)
    index_size, pos = _varint(footer, pos)
    table = {}
    for _, handle in _entries(_block(data, index_offset, index_size, str(path)), str(path)):
        offset, at = _varint(handle, 0)
        size, _ = _varint(handle, at)
        table.update(_entries(_block(data, offset, size, str(path)), str(path)))
    return table


class Bundle:
    """The checkpoint at ``prefix`` (``.../variables/variables``): tensors by checkpoint key."""

    def __init__(self, prefix: str | Path):
        from tensorflow.core.protobuf import tensor_bundle_pb2  # a message module: no TensorFlow runtime

        self.prefix = str(prefix)
        index = Path(self.prefix + ".index")
        if not index.is_file():
            raise BundleError(f"{index}: no such file (the SavedModel's variables are missing)")
        raw = read_table(index)
        header = tensor_bundle_pb2.BundleHeaderProto.FromString(raw.pop(b"", b""))
        if header.endianness != tensor_bundle_pb2.BundleHeaderProto.LITTLE:
            raise BundleError(f"{index}: a big-endian checkpoint")
        self.num_shards = header.num_shards or 1
        self.entries = {key.decode(): tensor_bundle_pb2.BundleEntryProto.FromString(value)
                        for key, value in raw.items()}
        self._shards: dict[int, bytes] = {}

    def _shard(self, shard_id: int) -> bytes:
        data = self._shards.get(shard_id)
        if data is None:
            path = Path(f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}")
            try:
                data = self._shards[shard_id] = path.read_bytes()
            except OSError as exc:
                raise BundleError(f"{path}: {exc.strerror}") from None
        return data

    def tensor(self, key: str) -> np.ndarray:
        entry = self.entries.get(key)
        if entry is None:
            raise BundleError(f"{self.prefix}: no tensor {key!r} in the checkpoint")
        if entry.slices:
            raise BundleError(f"{self.prefix}: {key} is a partitioned variable (slices), which this reader does not join")
        shape = tuple(d.size for d in entry.shape.dim)
        data = self._shard(entry.shard_id)
        raw = data[entry.offset:entry.offset + entry.size]
        if len(raw) != entry.size:
            raise BundleError(f"{self.prefix}: {key} runs past the end of shard {entry.shard_id} (truncated?)")
        if dtypes.is_string(entry.dtype):
            value, checksum = _strings(raw, shape, key)
        else:
            value, checksum = None, crc32c(raw)
        if checksum != unmask(entry.crc32c):
            raise BundleError(f"{self.prefix}: {key} fails its CRC32C check (corrupted checkpoint)")
        if value is not None:
            return value
        dtype = dtypes.to_numpy(entry.dtype)
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _strings(raw: bytes, shape: tuple[int, ...], key: str) -> tuple[np.ndarray, int]:
    """A string tensor and the CRC32C its entry holds. The layout: the lengths as varints, the masked
    CRC32C of the lengths (each as 4 little-endian bytes), then the bytes; the entry's CRC32C runs over
    the lengths as 4 bytes each, that checksum, then the bytes."""
    count = int(np.prod(shape, dtype=np.int64))
    pos, lengths = 0, []
    for _ in range(count):
        length, pos = _varint(raw, pos)
        lengths.append(length)
    checksum = crc32c(struct.pack(f"<{count}I", *lengths))
    if pos + 4 > len(raw) or unmask(struct.unpack_from("<I", raw, pos)[0]) != checksum:
        raise BundleError(f"string tensor {key}: its lengths fail their CRC32C check (corrupted checkpoint)")
    checksum = crc32c(raw[pos:pos + 4], checksum)
    pos += 4
    if pos < len(raw):
        checksum = crc32c(raw[pos:], checksum)
    out = np.empty(count, dtype=object)
    for i, length in enumerate(lengths):
        out[i] = raw[pos:pos + length]
        pos += length
    if pos != len(raw):
        raise BundleError(f"string tensor {key}: {len(raw) - pos} bytes left over")
    return out.reshape(shape), checksum
