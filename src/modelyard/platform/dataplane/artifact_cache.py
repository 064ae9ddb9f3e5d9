"""A model version's files on any node: published once to object storage, cached on each node's disk.

Replicas on a Ray cluster run on machines that share no disk with the platform. So the platform
publishes the directory a model version resolved to (a local path of its host, or its copy of a
``gs://``/``s3://`` artifact) to object storage under the directory's content hash, and each
replica's actor fetches it from there into its node's own cache before ``modelyard serve`` loads it.

- Where: ``$MODELYARD_ARTIFACT_STORE`` (a ``gs://bucket[/prefix]`` or ``s3://bucket[/prefix]``),
  default ``gs://modelyard-artifacts`` in the Cloud Storage ``STORAGE_EMULATOR_HOST`` names: the
  platform's own storage, which ``modelyard platform`` serves and names there. The bucket is made
  when missing. A version is ``<store>/<digest>/files/...`` plus ``<digest>/manifest.json``,
  written last: a manifest means the version is there whole, so publishing again costs one read.
- The digest hashes every file's relative path and bytes: the same model uploaded twice is stored
  and cached once, and a changed file is a new entry, never a stale one.
- Each node caches under ``<cache>/artifacts/<digest>`` (``<cache>``: ``$MODELYARD_CACHE``, else
  ``~/.cache/modelyard``, as for the demo model and the LiteRT cache). A download lands in a
  temporary directory, is checked against its digest and renamed into place. The cache is bounded
  (``$MODELYARD_ARTIFACT_CACHE_MAX_MB``, default 10240): after each download the entries used least
  recently are removed until the rest fit, except entries a running replica holds for its life. The
  placing, holding and bounding are the node cache's (``modelyard.node_cache``), as for a batch job's model.
- A node that has the platform's path itself (the platform's own host, or a shared disk) with
  the same digest uses it in place: nothing is copied there.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from modelyard import node_cache, objstore

log = logging.getLogger(__name__)

STORE_ENV, DEFAULT_STORE = "MODELYARD_ARTIFACT_STORE", "gs://modelyard-artifacts"
MAX_MB_ENV, DEFAULT_MAX_MB = "MODELYARD_ARTIFACT_CACHE_MAX_MB", 10240
MANIFEST = "manifest.json"


class ArtifactError(Exception):
    """The model's files could not be published or fetched; the message says which and why."""


@dataclass(frozen=True)
class Source:
    """Where a node gets a model version: its digest, its prefix in object storage, the platform's path."""

    digest: str
    uri: str
    path: str

    def as_dict(self) -> dict:
        return {"digest": self.digest, "uri": self.uri, "path": self.path}


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def digest_of(root: Path) -> str:
    """A hash of every file under ``root``: relative paths and bytes."""
    digest = hashlib.sha256(b"modelyard-artifact-1")
    for path in _files(root):
        digest.update(b"\0" + path.relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()[:40]


_digests: dict[tuple, str] = {}  # (path, every file's name, size and mtime) -> digest: hashed once per change


def _memo_digest(root: Path) -> str:
    key = (str(root), tuple((p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns)
                            for p in _files(root) for st in (p.stat(),)))
    if key not in _digests:
        _digests[key] = digest_of(root)
    return _digests[key]


def store_prefix() -> str:
    prefix = os.environ.get(STORE_ENV, DEFAULT_STORE).rstrip("/")
    if not objstore.is_remote(prefix):
        raise ArtifactError(f"${STORE_ENV}={prefix!r}: name a gs:// or s3:// bucket every node can reach")
    return prefix


_publishing = threading.Lock()  # the replicas of one deploy start side by side: one upload, one bucket creation


def publish(path: Path) -> Source:
    """Publish the model directory ``path`` (on this host) once; returns where nodes fetch it."""
    with _publishing:
        return _publish(Path(path))


def _ensure_bucket(fs, bucket: str) -> None:
    if fs.exists(bucket):
        return
    try:
        fs.mkdir(bucket)
    except Exception:  # made meanwhile by another platform (409): fine if it exists now
        fs.invalidate_cache()
        if not fs.exists(bucket):
            raise


def _publish(path: Path) -> Source:
    try:
        digest = _memo_digest(path)
        prefix = f"{store_prefix()}/{digest}"
        if objstore.read_text(f"{prefix}/{MANIFEST}") is None:
            fs = objstore.filesystem(objstore.scheme_of(prefix))
            _ensure_bucket(fs, prefix.split("://", 1)[1].split("/", 1)[0])
            files = objstore.publish_tree(Path(path), f"{prefix}/files")
            manifest = json.dumps({"digest": digest, "files": files, "from": str(path)})
            with fs.open(f"{prefix}/{MANIFEST}", "wb") as f:  # last: its presence means the rest is there
                f.write(manifest.encode())
            log.info("published %s (%d file(s)) to %s", path, files, prefix)
    except objstore.StorageError as exc:
        raise ArtifactError(f"cannot publish the model {path} for the cluster's nodes: {exc.message}") from None
    except Exception as exc:  # gcsfs/s3fs raise their own errors (HttpError ...), OSError for local reads
        raise ArtifactError(f"cannot publish the model {path} for the cluster's nodes: {exc}") from None
    return Source(digest, prefix, str(path))


def cache_root() -> Path:
    from modelyard.demo import default_cache_dir

    return default_cache_dir() / "artifacts"


class Lease:
    """A replica's hold on its model's files: while open, eviction leaves the cache entry alone."""

    def __init__(self, path: Path, cached: bool, hold=None) -> None:
        self.path = path
        self.cached = cached  # fetched into this node's cache (False: the platform's own path, in place)
        self._hold = hold

    def release(self) -> None:
        if self._hold is not None:
            self._hold.close()
            self._hold = None


def fetch(source: dict) -> Lease:
    """The model's files on this node: the platform's path when this node has it (same digest), else
    this node's cache entry, downloaded first if missing."""
    digest, here = source["digest"], Path(source["path"])
    if here.is_dir():
        try:
            if digest_of(here) == digest:
                return Lease(here, cached=False)
        except OSError:
            pass  # unreadable here: fetch it as any other node does
    root = cache_root()
    try:
        with node_cache.locked(root):  # one download per node at a time, and no eviction meanwhile
            entry = root / digest
            if not entry.is_dir():
                node_cache.place(entry, lambda partial: _download(source["uri"], digest, partial))
                log.info("cached %s as %s", source["uri"], entry)
            hold = node_cache.hold(entry)
            os.utime(entry)  # used now: the last to be evicted
            evict(root, keep=digest)
    except objstore.StorageError as exc:
        raise ArtifactError(f"cannot fetch the model {source['path']} from {source['uri']}: {exc.message}") from None
    except OSError as exc:
        raise ArtifactError(f"cannot cache the model {source['path']} under {root}: {exc}") from None
    return Lease(entry, cached=True, hold=hold)


def _download(uri: str, digest: str, partial: Path) -> None:
    objstore.get_tree(f"{uri}/files", partial)
    got = digest_of(partial)
    if got != digest:  # a torn or altered upload: never serve it
        raise ArtifactError(f"the model fetched from {uri} does not match its digest ({got} != {digest})")


def evict(root: Path, keep: str | None = None) -> list[str]:
    """Remove the entries used least recently until the cache fits its bound; entries a replica holds,
    and ``keep``, stay. Call with the cache's lock held. Returns the digests removed."""
    limit = node_cache.max_bytes(MAX_MB_ENV, DEFAULT_MAX_MB)
    removed = [entry.name for entry in node_cache.prune(root, keep=root / (keep or ""), limit=limit)]
    if removed:
        log.info("artifact cache over %d MiB: removed %d model(s) used least recently", limit >> 20, len(removed))
    return removed
