"""``uploadType=multipart``: a ``multipart/related`` body of two parts, the object's JSON metadata and
then its bytes, read as a stream (the bytes go to the writer as they arrive, never held whole).

Clients differ on line endings (google-cloud-storage sends CRLF, gcsfs bare LF), so both are taken.
The media part runs to the closing delimiter at the very end of the body: everything but a short tail
is written as it comes, and the tail is cut at the last delimiter at end of stream.
"""
from __future__ import annotations

import re

from modelyard.platform.storage.bodies import parse_object
from modelyard.platform.storage.errors import invalid

_HEAD_LIMIT = 1 << 20  # the metadata part and the part headers


def boundary_of(content_type: str) -> bytes:
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not m or not content_type.lower().startswith("multipart/"):
        raise invalid("Invalid multipart upload: Content-Type must be multipart/related with a boundary.")
    return m.group(1).encode()


def _split_head(buf: bytes) -> tuple[bytes, bytes] | None:
    """(headers, rest) at the first blank line (CRLF or LF), or None if not there yet."""
    m = re.search(rb"\r?\n\r?\n", buf)
    return (buf[:m.start()], buf[m.end():]) if m else None


def _content_type(headers: bytes) -> str | None:
    for line in headers.decode("latin-1").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-type":
            return value.strip()
    return None


async def read_multipart(content, content_type: str, write, on_metadata=None) -> tuple[dict, str | None]:
    """Parse the body from ``content`` (an aiohttp StreamReader), calling ``write(bytes)`` with the
    media as it arrives (``on_metadata(metadata)`` first); returns (metadata, the media part's Content-Type)."""
    delim = b"--" + boundary_of(content_type)
    buf = b""
    # 1. up to the media part's first byte: delimiter, metadata headers, JSON, delimiter, media headers
    while True:
        first = buf.find(delim)
        second = buf.find(delim, first + len(delim)) if first >= 0 else -1
        if second >= 0:
            after = _split_head(buf[second + len(delim):])
            if after is not None:
                break
        if len(buf) > _HEAD_LIMIT:
            raise invalid("Invalid multipart upload: no media part within the first MiB.")
        chunk = await content.readany()
        if not chunk:
            raise invalid("Invalid multipart upload: the body ends before its media part.")
        buf += chunk
    meta_part = _split_head(buf[first + len(delim):second])
    if meta_part is None:
        raise invalid("Invalid multipart upload: the metadata part has no headers.")
    metadata = parse_object(meta_part[1], "Invalid multipart upload: the metadata part is not a JSON object")
    media_headers, tail = after
    if on_metadata is not None:
        on_metadata(metadata)
    # 2. the media, holding back what could be the closing delimiter
    keep = len(delim) + 8  # CRLF + delimiter + "--" + CRLF
    while True:
        chunk = await content.readany()
        if not chunk:
            break
        tail += chunk
        if len(tail) > keep + (1 << 20):
            write(tail[:-keep])
            tail = tail[-keep:]
    end = tail.rfind(delim)
    if end < 0 or not tail[end + len(delim):].startswith(b"--"):
        raise invalid("Invalid multipart upload: the body does not end with the closing delimiter.")
    media_end = end - 2 if tail[:end].endswith(b"\r\n") else end - 1 if tail[:end].endswith(b"\n") else end
    write(tail[:media_end])
    return metadata, _content_type(media_headers)
