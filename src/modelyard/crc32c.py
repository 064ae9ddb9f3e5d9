"""CRC-32C (Castagnoli), the checksum of TFRecord files and of TensorFlow's tensor bundles, and the
masking both store it under: the one place these rules are written down.

The CRC is google-crc32c's (a dependency of every install and image; its C code runs at GB/s and the
package carries its own pure-Python fallback). It is bound at import, not looked up per call: the
TFRecord readers check one 8-byte header per record, where a per-call import doubled the cost.
"""
from __future__ import annotations

import google_crc32c

_value = google_crc32c.value
_extend = google_crc32c.extend

# LevelDB's (and so TFRecord's and the tensor bundle's) mask: a CRC stored over data that holds CRCs
# would otherwise be trivially predictable, so stored CRCs are rotated and offset.
_MASK_DELTA = 0xA282EAD8


def crc32c(data: bytes, crc: int = 0) -> int:
    """The CRC-32C of ``data`` (bytes: google-crc32c refuses a memoryview), continuing from ``crc``."""
    return _extend(crc, data) if crc else _value(data)


def mask(crc: int) -> int:
    """``crc`` as TFRecord and LevelDB store it."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def unmask(masked: int) -> int:
    """A stored (masked) CRC back to the CRC: ``unmask(mask(c)) == c``."""
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """The masked CRC-32C of ``data``, as a TFRecord stores it after a record's length and data."""
    return mask(_value(data))
