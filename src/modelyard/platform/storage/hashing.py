"""Checksums as Cloud Storage reports them: CRC32C and MD5, base64 of the big-endian digest.

CRC32C (google-crc32c's C code, GB/s) is computed while every object is written; MD5 (a few hundred
MB/s) only inline for small objects or when a client sent one to check, otherwise afterwards by the
background hasher (``objects.Store``), so large uploads run at disk speed.
"""
from __future__ import annotations

import base64
import hashlib

import google_crc32c

MD5_INLINE_LIMIT = 8 << 20  # bytes: below this MD5 costs under ~30 ms, computed while writing
READ_CHUNK = 1 << 20


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def crc_b64(crc: int) -> str:
    return b64(crc.to_bytes(4, "big"))


class Hasher:
    """Running CRC32C (always) and MD5 (while ``md5`` is on) of the bytes written so far."""

    def __init__(self, md5: bool = True) -> None:
        self.crc = 0
        self.size = 0
        self._md5 = hashlib.md5() if md5 else None

    def update(self, data: bytes | memoryview) -> None:
        self.crc = google_crc32c.extend(self.crc, data)
        self.size += len(data)
        if self._md5 is not None:
            self._md5.update(data)

    def drop_md5(self) -> None:
        self._md5 = None

    @property
    def crc32c(self) -> str:
        return crc_b64(self.crc)

    @property
    def md5(self) -> str | None:
        return b64(self._md5.digest()) if self._md5 is not None else None


def file_md5(path) -> str:
    with open(path, "rb") as f:
        return fileobj_md5(f)


def fileobj_md5(f) -> str:
    """MD5 of an open file from its start (blocking: run it in a thread)."""
    h = hashlib.md5()
    f.seek(0)
    while chunk := f.read(READ_CHUNK):
        h.update(chunk)
    return b64(h.digest())
