"""A node's bounded cache of directories kept by content hash, and directories shipped to it as bytes.

The one rule for what a Ray node keeps on its own disk (it shares none with the machine that starts
a job): an entry is a directory named by the hash of its content; it is written into a temporary
directory beside it and renamed into place (``place``), so a reader sees all of it or none and two
processes placing the same digest at once both end with one whole entry; the same content is the
same name, so a second job with it on that node fetches nothing, and a changed one is a new name,
never a stale entry. The cache is bounded: after each placement the entries used least recently
are dropped until the rest fit (``prune``), never the one just asked for nor one a running user
holds (``hold``: a shared ``flock`` on ``<entry>.use``, which the platform's replicas and a batch job's
actors take for their life). Two caches use it:

- this module's own (``materialize``): a tree that travels as one uncompressed tar (``pack``), named
  by the SHA-256 of its bytes, e.g. a batch job's model through Ray's object store. Bounded by
  ``$MODELYARD_NODE_CACHE_MAX_MB`` (default 4096); where: ``$MODELYARD_NODE_CACHE``, else ``node/``
  in the node's modelyard cache (``$MODELYARD_CACHE``, ... ``~/.cache/modelyard`` of the user it runs as);
- the platform's model versions fetched from object storage (``platform.dataplane.artifact_cache``).

Imports only the standard library (and ``modelyard.demo``'s cache rule, when asked where).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

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


def max_bytes(env: str = MAX_MB_ENV, default_mb: int = DEFAULT_MAX_MB) -> int:
    """The bound ``$env`` sets in MiB (``default_mb`` when unset or not a number)."""
    try:
        return int(float(os.environ.get(env, default_mb)) * 1024 * 1024)
    except ValueError:
        return default_mb * 1024 * 1024


def _size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def _flocked(path: Path, mode: int):
    f = open(path, "a+b")
    try:
        fcntl.flock(f, mode)
    except BaseException:
        f.close()
        raise
    return f


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """The cache's lock: one placement or pruning at a time on this node, across processes."""
    root.mkdir(parents=True, exist_ok=True)
    f = _flocked(root / ".lock", fcntl.LOCK_EX)
    try:
        yield
    finally:
        f.close()


def hold(entry: Path):
    """A shared hold on ``entry`` (an open file: close it to let go); ``prune`` never drops a held entry."""
    return _flocked(entry.with_name(f"{entry.name}.use"), fcntl.LOCK_SH)


def place(entry: Path, fill: Callable[[Path], None]) -> Path:
    """Make ``entry`` whole at once: ``fill(partial)`` writes (and checks) the files into a temporary
    directory beside it, which is then renamed into place, so a reader sees all of it or none. Another
    process's whole copy, placed meanwhile, is kept; ``fill``'s error leaves nothing behind."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{entry.name[:12]}-", dir=entry.parent))
    try:
        fill(partial)
        try:
            partial.rename(entry)
        except OSError:
            if not entry.is_dir():  # not another process's whole copy: a real failure
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    os.utime(entry, (time.time(), time.time()))
    return entry


def prune(root: Path, keep: Path, limit: int | None = None) -> list[Path]:
    """Drop the entries used least recently until the cache fits ``limit`` bytes (``max_bytes()`` when
    None); ``keep`` and the entries someone holds (``hold``) stay. Returns those dropped."""
    limit = max_bytes() if limit is None else limit
    entries = [e for e in root.iterdir() if e.is_dir() and not e.name.startswith(".")]
    sizes = {e: _size(e) for e in entries}
    total, dropped = sum(sizes.values()), []
    for entry in sorted(entries, key=lambda e: e.stat().st_mtime):
        if total <= limit:
            break
        if entry == keep:
            continue
        use = entry.with_name(f"{entry.name}.use")
        f = open(use, "a+b")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # in use (a running replica serves from it)
            f.close()
            continue
        try:
            shutil.rmtree(entry, ignore_errors=True)
            use.unlink(missing_ok=True)
        finally:
            f.close()
        total -= sizes[entry]
        dropped.append(entry)
    return dropped


def materialize(digest: str, fetch: Callable[[], bytes], root: Path | None = None) -> tuple[Path, bool]:
    """``(directory holding the tree of ``digest``, whether it was fetched now)``; ``fetch()`` gives the
    tar bytes and is called only when this node has no whole copy. The bytes are checked against the
    digest: a damaged transfer is an error, never a wrong model."""
    root = root or cache_root()
    entry = root / digest
    with locked(root):  # not pruned by another process between the look and the mark
        if entry.is_dir():
            os.utime(entry)  # used: the last to be dropped
            return entry, False
    data = fetch()
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        raise ValueError(f"node cache: the bytes fetched for {digest[:12]} hash to {got[:12]}")

    def unpack(partial: Path) -> None:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(partial, filter="data")  # "data": no absolute names, links out or devices

    with locked(root):
        place(entry, unpack)
        prune(root, keep=entry)
    return entry, True
