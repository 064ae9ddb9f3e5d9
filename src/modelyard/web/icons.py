"""The app's icons, drawn at convert time with the standard library (PNG: zlib + CRC, no image library).

The picture is a rounded tile in the theme colour with five probability bars, the tallest
highlighted, the page's own result drawing in miniature. Its shapes keep inside the central
80 % so the same file also serves as a maskable icon.
"""
from __future__ import annotations

import struct
import zlib

THEME = (0x3B, 0x6F, 0xD8)
HIGHLIGHT = (0x7F, 0xE0, 0xA0)
WHITE = (0xFF, 0xFF, 0xFF)
SIZES = (192, 512)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(width: int, height: int, rows: list[bytes]) -> bytes:
    """An 8-bit RGBA PNG of ``rows`` (each ``width * 4`` bytes)."""
    raw = b"".join(b"\x00" + row for row in rows)  # filter type 0 on every row
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")


def _pixel(x: float, y: float) -> tuple[int, int, int, int]:
    """The icon's colour at (x, y) in 0..1 coordinates."""
    radius = 0.18  # the tile's rounded corners
    cx, cy = min(max(x, radius), 1 - radius), min(max(y, radius), 1 - radius)
    if (x - cx) ** 2 + (y - cy) ** 2 > radius ** 2:
        return (0, 0, 0, 0)
    heights = (0.25, 0.55, 0.38, 0.18, 0.1)  # five bars, the second one on top
    for k, h in enumerate(heights):
        left = 0.2 + k * 0.125
        if left <= x < left + 0.09 and 0.78 - h * 0.9 <= y < 0.78:
            return (*(HIGHLIGHT if k == 1 else WHITE), 255)
    if 0.18 <= x < 0.82 and 0.79 <= y < 0.81:  # the axis
        return (*WHITE, 255)
    return (*THEME, 255)


def icon(size: int) -> bytes:
    rows = []
    for j in range(size):
        y = (j + 0.5) / size
        rows.append(b"".join(bytes(_pixel((i + 0.5) / size, y)) for i in range(size)))
    return png(size, size, rows)


def theme_hex() -> str:
    return "#%02x%02x%02x" % THEME
