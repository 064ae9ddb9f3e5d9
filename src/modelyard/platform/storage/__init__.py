"""Cloud Storage served by the platform: the JSON API that ``google-cloud-storage``, ``gcsfs`` and the
Vertex AI SDK speak, over plain files (``gs://BUCKET/NAME`` is ``ROOT/BUCKET/NAME``).

Modules: ``names`` (the name rules and the one mapping to files), ``errors`` (Google's error body),
``meta`` (generations, checksums, settings in SQLite), ``hashing``, ``bodies`` (JSON bodies' limits),
``objects`` (the store), ``uploads`` (resumable sessions), ``multipart``, ``routes`` (HTTP), ``server``
(the process). ``local_file`` is how the rest of the platform turns a ``gs://`` URI or a ``/gcs/`` path
into the file it names.

May import: the standard library, aiohttp and google-crc32c; of modelyard only ``platform.api.bearer`` (the
platform's one token rule), ``platform.api.read_grants`` (what a read-only token may read) and
``platform.api.http_limits`` (its ports' connection limits), all leaves:
this is a leaf the platform's CLI starts as a process and the job code asks for paths.
"""
from __future__ import annotations

from pathlib import Path

from modelyard.platform.storage.errors import StorageApiError
from modelyard.platform.storage.names import object_path, split_uri

__all__ = ["local_file", "StorageApiError"]


def local_file(uri: str, root: Path | str | None) -> Path | None:
    """The file under ``root`` (the platform's ``config.storage_root``) that ``gs://bucket/name`` or
    ``/gcs/bucket/name`` names, or None when this platform serves no storage (``root`` None: an outside
    ``STORAGE_EMULATOR_HOST``). ``gs://bucket`` alone is the bucket's directory. A name that could leave
    the root raises ``StorageApiError`` (400). The file need not exist (a job may be about to write it)."""
    if root is None:
        return None
    bucket, name = split_uri(uri)
    root = Path(root)
    if not name or name == "/":
        return root / bucket
    return object_path(root, bucket, name)
