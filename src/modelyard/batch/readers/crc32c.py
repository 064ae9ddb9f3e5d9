"""CRC-32C (Castagnoli) with TFRecord's masking, table-driven in pure Python.

Record headers (8 bytes) are checked while scanning, record data on decode. The C
implementation from google-crc32c (installed with google-cloud-storage) is used when
present; the pure-Python fallback is correct but slow on large records.
"""
from __future__ import annotations

try:  # the C implementation, when present (it ships with google-cloud-storage)
    import google_crc32c as _fast

    def crc32c(data: bytes) -> int:
        return _fast.value(data)
except ImportError:  # pragma: no cover - depends on the environment
    _fast = None
    _TABLE = []
    for _i in range(256):
        _c = _i
        for _ in range(8):
            _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
        _TABLE.append(_c)

    def crc32c(data: bytes) -> int:
        crc = 0xFFFFFFFF
        for byte in data:
            crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
