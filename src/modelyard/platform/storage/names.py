"""Bucket and object names, and the one rule mapping them to files under the storage root.

``gs://BUCKET/NAME`` is the file ``ROOT/BUCKET/NAME``. A name that could leave the root or that no
file can hold (``..``/``.`` segments, an empty segment as in ``a//b`` or ``/abs``, NUL, CR/LF, a
segment over 255 bytes, a symlink out of the root) is refused with Cloud Storage's 400 ``invalid``.
Percent-decoding happens before these checks (the routes decode once, with ``decode``: strict UTF-8),
so ``%2e%2e`` is ``..`` here. A bucket's directory that is a symlink is refused too.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from modelyard.platform.storage.errors import invalid

META_DIR = ".modelyard"  # metadata and unfinished uploads; never a bucket (bucket names start alphanumeric)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


def check_bucket(bucket: str) -> str:
    """A valid bucket name (Cloud Storage's rules: 3-63 characters, or 222 with dots, lowercase,
    digits, ``-``, ``_``, ``.``; starts and ends with a letter or digit) or a 400."""
    parts = bucket.split(".")
    if not _BUCKET.fullmatch(bucket) or any(not p or len(p) > 63 for p in parts) or (len(parts) == 1 and len(bucket) > 63):
        raise invalid(f"Invalid bucket name: '{bucket}'")
    return bucket


def check_object(name: str) -> str:
    """A valid object name that maps to a file inside its bucket's directory, or a 400.
    A name ending in ``/`` (a "folder" placeholder) is allowed: it is the directory itself."""
    try:
        raw = name.encode("utf-8")  # strict: a lone surrogate (from JSON's \\udc80) is no UTF-8
    except UnicodeEncodeError:
        raise invalid(f"Invalid object name: {name[:80]!r}: object names are valid UTF-8.") from None
    if not name or len(raw) > 1024:
        raise invalid(f"Invalid object name: {name[:80]!r}: object names are 1-1024 bytes of UTF-8.")
    if any(c in name for c in "\0\r\n"):
        raise invalid(f"Invalid object name: {name[:80]!r}: NUL, CR and LF are not allowed.")
    segments = name[:-1].split("/") if name.endswith("/") else name.split("/")
    for seg in segments:
        if seg in ("", ".", ".."):
            raise invalid(f"Invalid object name: {name[:80]!r}: this storage keeps objects as files, so a name "
                          "cannot start with '/', hold '//', or have a '.' or '..' segment.")
        if len(seg.encode()) > 255:
            raise invalid(f"Invalid object name: {name[:80]!r}: a '/'-separated segment is over 255 bytes.")
    return name


def bucket_dir(root: Path, bucket: str) -> Path:
    """``ROOT/BUCKET``; a 400 when that directory is a symlink (a bucket is a real directory of the root,
    so nothing outside it is ever served or written through one)."""
    path = root / check_bucket(bucket)
    if os.path.islink(path) or os.path.realpath(path) != os.path.join(os.path.realpath(root), bucket):
        raise invalid(f"Invalid bucket: '{bucket}' is not a directory of the storage root (a symlink).")
    return path


def decode(segment: str) -> str:
    """One percent-encoded path segment or query value, decoded as strict UTF-8: Cloud Storage answers
    400 to bytes that are not UTF-8, where a lenient decode would map them all to U+FFFD (one name)."""
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError:
        raise invalid(f"Invalid object or bucket name {segment[:80]!r}: names are valid UTF-8.") from None


def object_path(root: Path, bucket: str, name: str) -> Path:
    """The file of ``gs://bucket/name`` under ``root``; a 400 for a bad name or one whose real path
    (symlinks followed) leaves the bucket's directory."""
    base = bucket_dir(root, bucket)
    path = base / check_object(name).rstrip("/")
    real = os.path.realpath(path)
    real_base = os.path.realpath(base)
    if real != real_base and not real.startswith(real_base + os.sep):
        raise invalid(f"Invalid object name: {name[:80]!r}: it resolves outside its bucket (a symlink).")
    return path


def split_uri(uri: str) -> tuple[str, str]:
    """``gs://b/n`` or ``/gcs/b/n`` -> ``("b", "n")`` (n may be ``""`` for the bucket itself)."""
    if uri.startswith("gs://"):
        rest = uri[5:]
    elif uri.startswith("/gcs/"):
        rest = uri[5:]
    else:
        raise invalid(f"{uri!r} is not a gs:// URI or a /gcs/ path")
    bucket, _, name = rest.partition("/")
    return check_bucket(bucket), name
