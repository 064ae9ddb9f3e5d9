"""Directories shipped to another machine as bytes and kept there by content hash, bounded.

A Ray node shares no disk with the machine that starts a job: a model directory (or any tree a
job needs) travels as one uncompressed tar (``pack``), named by the SHA-256 of its bytes, and
each node unpacks it once under ``<cache>/<digest>/`` (``materialize``). The same bytes give
the same digest, so a second job with the same model on that node finds it there and fetches
nothing; a changed model is a new digest, never a stale entry.

An entry is unpacked into a temporary directory and renamed into place, so a reader sees all of
it or none, and two processes unpacking the same digest at once both end with one whole entry.
The cache is bounded (``$MODELYARD_NODE_CACHE_MAX_MB``, default 4096): after each unpack the
entries used least recently (``materialize`` marks its entry used) are dropped until the rest
fit, never the one just asked for. Where it lives: ``$MODELYARD_NODE_CACHE``, else ``node/`` in
the node's modelyard cache (``$MODELYARD_CACHE``, ... ``~/.cache/modelyard`` of the user it runs as).

Imports only the standard library (and ``modelyard.demo``'s cache rule, when asked where).
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT_ENV, MAX_MB_ENV, DEFAULT_MAX_MB = "MODELYARD_NODE_CACHE", "MODELYARD_NODE_CACHE_MAX_MB", 4096


def cache_root() -> Path:
    from modelyard.demo import default_cache_dir

    found = os.environ.get(ROOT_ENV)
    return Path(found) if found else default_cache_dir() / "node"


def pack(directory: Path) -> tuple[str, bytes]:
    """``(sha256 hex, tar bytes)`` of every file under ``directory``: names sorted and times, owners
    and modes normalised, so the same files always give the same digest."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(Path(directory).rglob("*")):
            if not path.is_file():
                continue  # directories come back from the files' names
            info = tarfile.TarInfo(path.relative_to(directory).as_posix())
            info.size = path.stat().st_size
            info.mode = 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)
    data = buffer.getvalue()
    return hashlib.sha256(data).hexdigest(), data


def max_bytes() -> int:
    try:
        return int(float(os.environ.get(MAX_MB_ENV, DEFAULT_MAX_MB)) * 1024 * 1024)
    except ValueError:
        return DEFAULT_MAX_MB * 1024 * 1024


def _size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def prune(root: Path, keep: Path) -> list[Path]:
    """Drop the least recently used entries until the cache fits its bound; returns those dropped."""
    entries = [e for e in root.iterdir() if e.is_dir() and not e.name.startswith(".")]
    sizes = {e: _size(e) for e in entries}
    total, dropped = sum(sizes.values()), []
    for entry in sorted(entries, key=lambda e: e.stat().st_mtime):
        if total <= max_bytes():
            break
        if entry == keep:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        total -= sizes[entry]
        dropped.append(entry)
    return dropped


def materialize(digest: str, fetch: Callable[[], bytes], root: Path | None = None) -> tuple[Path, bool]:
    """``(directory holding the tree of ``digest``, whether it was fetched now)``; ``fetch()`` gives the
    tar bytes and is called only when this node has no whole copy. The bytes are checked against the
    digest: a damaged transfer is an error, never a wrong model."""
    root = root or cache_root()
    entry = root / digest
    if entry.is_dir():
        os.utime(entry)  # used: the last to be dropped
        return entry, False
    data = fetch()
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        raise ValueError(f"node cache: the bytes fetched for {digest[:12]} hash to {got[:12]}")
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=root))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(partial, filter="data")  # "data": no absolute names, links out or devices
        try:
            partial.rename(entry)
        except OSError:
            if not entry.is_dir():  # not another process's whole copy: a real failure
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    os.utime(entry, (time.time(), time.time()))
    prune(root, keep=entry)
    return entry, True
