"""``gs://`` job directories, exports and data for ``modelyard train``, written by TensorFlow's own ``gs://``.

A config's ``job_dir``, ``export_to`` and ``data`` paths may be ``gs://`` URIs of the platform's storage
(or any Cloud Storage JSON API that ``STORAGE_EMULATOR_HOST`` names): checkpoints, ``BackupAndRestore``,
TensorBoard events and the model go there through ``tf.io.gfile``, which ``modelyard.tf_gcs`` points at
that storage (``route``: once per process, before the first ``gs://`` call). ``UriPath`` is the part of
``pathlib.Path`` the trainer uses (``/``, ``mkdir``, ``read_text``/``write_text``, ``exists``, ``is_dir``,
``iterdir``), over ``tf.io.gfile``; local paths stay ``Path``. One object write is whole or absent, so
``metrics.json`` needs no temporary file there. An export is written locally first (checked servable by
``modelyard.export``), then copied into the next free version under the base URI, ``saved_model.pb``
last: a server that sees it sees the rest.

May import: ``modelyard.tf_gcs``, ``modelyard.model`` (export), the standard library; TensorFlow at call time.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Iterator

STORAGE_SCHEME = "gs://"  # what TensorFlow's own file system and the platform's storage share
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
STORAGE_ENV = "STORAGE_EMULATOR_HOST"


def is_uri(value: object) -> bool:
    """Whether ``value`` (a config value, a path) is a URI rather than a local path."""
    return isinstance(value, UriPath) or (isinstance(value, str) and bool(_URI.match(value)))


def check(key: str, value: str) -> None:
    """A config's URI ``value`` for ``key``: ValueError naming the key unless ``modelyard train`` can reach it
    (a ``gs://`` URI, with ``STORAGE_EMULATOR_HOST`` naming the storage)."""
    if not value.startswith(STORAGE_SCHEME):
        raise ValueError(f"{key}: {value} is a storage URI of a scheme modelyard train does not write; give a "
                         f"gs:// URI (the platform's storage) or a local path")
    if not os.environ.get(STORAGE_ENV):
        raise ValueError(f"{key}: {value} is a gs:// URI and no storage is named: export {STORAGE_ENV} "
                         "(the URL `modelyard platform` prints, e.g. http://127.0.0.1:9023) so TensorFlow's gs:// "
                         "reaches the platform's storage")


def route() -> None:
    """Send this process's TensorFlow ``gs://`` to the storage ``STORAGE_EMULATOR_HOST`` names (with
    ``MODELYARD_STORAGE_TOKEN``), unless it already goes there (a platform job's gateway: ``tf_gcs``)."""
    from modelyard import tf_gcs

    tf_gcs.enable()


class UriPath:
    """A ``gs://`` path with the ``pathlib.Path`` methods the trainer uses, over ``tf.io.gfile``."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/") if len(uri.rstrip("/")) > len(STORAGE_SCHEME) else uri

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"UriPath({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UriPath) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __truediv__(self, part: str | os.PathLike) -> "UriPath":
        return UriPath(f"{self.uri}/{os.fspath(part).strip('/')}")

    @property
    def name(self) -> str:
        return self.uri.rsplit("/", 1)[-1]

    @property
    def parent(self) -> "UriPath":
        return UriPath(self.uri.rsplit("/", 1)[0])

    def with_name(self, name: str) -> "UriPath":
        return self.parent / name

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        from tensorflow.io import gfile

        gfile.makedirs(self.uri)

    def exists(self) -> bool:
        from tensorflow.io import gfile

        return gfile.exists(self.uri)

    def is_dir(self) -> bool:
        from tensorflow.io import gfile

        return gfile.isdir(self.uri)

    def iterdir(self) -> Iterator["UriPath"]:
        from tensorflow.io import gfile

        if not gfile.isdir(self.uri):
            return iter(())
        return iter([self / name for name in gfile.listdir(self.uri)])

    def read_text(self) -> str:
        from tensorflow.io import gfile

        with gfile.GFile(self.uri, "r") as f:
            return f.read()

    def write_text(self, text: str) -> None:
        from tensorflow.io import gfile

        with gfile.GFile(self.uri, "w") as f:
            f.write(text)

    def rmtree(self) -> None:
        from tensorflow.io import gfile

        if gfile.exists(self.uri):
            gfile.rmtree(self.uri)


def open_binary(path: str):
    """A local file or a ``gs://`` object, opened for reading bytes (seekable: ``np.load`` takes it)."""
    if is_uri(path):
        from tensorflow.io import gfile

        return gfile.GFile(str(path), "rb")
    return open(path, "rb")


def open_text(path: str):
    if is_uri(path):
        from tensorflow.io import gfile

        return gfile.GFile(str(path), "r")
    return open(path, newline="")


def glob(pattern: str) -> list[str]:
    """Files matching ``pattern`` (local, or ``gs://`` objects), sorted."""
    if is_uri(pattern):
        from tensorflow.io import gfile

        return sorted(gfile.glob(pattern))
    import glob as local

    return sorted(local.glob(pattern))


def exists(path: str) -> bool:
    return UriPath(path).exists() if is_uri(path) else Path(path).exists()


def export(model: object, base: UriPath) -> UriPath:
    """``model`` as the next version under ``base`` (``gs://.../0002``): written and checked locally by
    ``modelyard.export``, then copied with ``tf.io.gfile``, ``saved_model.pb`` last."""
    from tensorflow.io import gfile

    from modelyard.model.export import export as export_local, version_dir_name

    taken = [int(name.strip("/")) for name in (gfile.listdir(base.uri) if gfile.isdir(base.uri) else [])
             if name.strip("/").isascii() and name.strip("/").isdigit()]
    version = max(taken, default=0) + 1
    target = base / version_dir_name(version)
    with tempfile.TemporaryDirectory(prefix="modelyard-export-") as tmp:
        local = export_local(model, Path(tmp), version, quiet=True)
        files = sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: (p.name == "saved_model.pb", str(p)))
        for f in files:
            dest = target / f.relative_to(local).as_posix()
            gfile.makedirs(dest.parent.uri)
            gfile.copy(str(f), dest.uri, overwrite=True)
    return target
