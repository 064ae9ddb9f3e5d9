"""A ``gs://`` base path served as TF Serving serves one: its versions mirrored into a local directory.

TF Serving's file system source lists a base path on Cloud Storage as it lists a local one. Here the
manager, the loaders and the policies work on local directories, so ``sync`` makes a local mirror of
the remote base path that they read as any other base path, and the poll loop calls it each poll:

- where: ``<cache>/serving-mirror/<hash of the URI>`` (``<cache>``: ``$MODELYARD_CACHE``, else
  ``~/.cache/modelyard``); ``<mirror>/<version>`` is a symbolic link to ``<mirror>/.v/<version>-<key>``,
  the version's files. ``key`` hashes every object's name, generation, checksum and size, so a
  version re-uploaded with other bytes is a new entry, never a stale one.
- an entry is downloaded whole into a temporary directory and renamed into place (``node_cache.place``)
  before the link is swapped (``os.replace``): a loader never sees half a version. Several ``--workers``
  (or servers) of one mirror sync it one at a time (a ``flock``), so they list and link the same.
- a remote version is seen once its ``saved_model.pb`` (``.pbtxt``, or ``model.tflite``) is there:
  TensorFlow writes it after the variables, so an upload under way is not loaded half-done (and if it
  is, its next listing is another key: the manager retries a failed version whose files changed).
- only the versions the model's policy aspires to are fetched (a bucket of fifty exports served
  ``latest`` costs one download), so the mirror is keyed by the URI and the policy.
- a version gone from the bucket is gone from the mirror: the manager unloads it as it would locally.
  A remote base path with no object at all reads as a missing base path.

The bucket is reached as every other client of the platform's storage reaches it (``objstore``:
``STORAGE_EMULATOR_HOST``, ``MODELYARD_STORAGE_TOKEN``, the CAs of ``SSL_CERT_FILE``): listing and
download are ``objstore.list_tree`` and ``objstore.get_tree``, the platform's artifact cache's rule.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from pathlib import Path

from modelyard import node_cache, objstore
from modelyard.model.savedmodel import SAVED_MODEL_FILES

log = logging.getLogger("modelyard.serving")

MODEL_FILES = (*SAVED_MODEL_FILES, "model.tflite")
ENTRIES = ".v"

_last_error: dict[str, str] = {}  # uri -> the last failure logged: said once, not every poll
_found: dict[str, bool] = {}  # uri -> whether its last listing in this process found any object
_syncing = threading.Lock()  # the poll loop and an on-demand load may sync at once: one at a time


def is_remote(base_path: object) -> bool:
    """Whether a base path names object storage (``gs://``) rather than a local directory."""
    return "://" in str(base_path) and not str(base_path).startswith("file://")


def requirement(uri: str, environ=os.environ) -> str | None:
    """Why ``uri`` cannot be served from here, or None: only ``gs://`` in the storage that
    ``STORAGE_EMULATOR_HOST`` names (the platform's own, or another Cloud Storage emulator)."""
    if not uri.startswith("gs://") or len(uri) <= len("gs://") or uri[len("gs://"):].startswith("/"):
        return (f"base path {uri} is not a gs://bucket/path URI: modelyard serve serves a local directory or "
                f"a gs:// prefix of the platform's storage")
    if not environ.get("STORAGE_EMULATOR_HOST"):
        return (f"base path {uri} is in Cloud Storage, and STORAGE_EMULATOR_HOST is not set: modelyard serve "
                f"reads gs:// from the storage it names (export STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT "
                f"of modelyard platform's storage; MODELYARD_STORAGE_TOKEN if it runs with --auth-token)")
    return None


def mirror_dir(uri: str, policy: object = None) -> Path:
    """The local directory a remote base path is mirrored in for a version policy (the same for every
    process of this user: ``policy``'s repr is a dataclass's, of plain values)."""
    from modelyard.demo import default_cache_dir

    name = hashlib.sha256(f"{uri.rstrip('/')}\0{policy!r}".encode()).hexdigest()[:20]
    return default_cache_dir() / "serving-mirror" / name


def _remote_versions(tree: dict[str, str]) -> dict[int, tuple[str, str]]:
    """Version number -> (its directory's name, the key of its content) for every complete remote
    version of a listing (``objstore.list_tree``)."""
    by_dir: dict[str, dict[str, str]] = {}
    for rel, tag in tree.items():
        top, _, rest = rel.partition("/")
        if top.isdigit() and rest:
            by_dir.setdefault(top, {})[rest] = tag
    found: dict[int, tuple[str, str]] = {}
    for name, files in sorted(by_dir.items()):
        if not any(f in files for f in MODEL_FILES):
            continue  # no model file yet: an upload under way
        key = hashlib.sha256("\0".join(f"{f}\0{files[f]}" for f in sorted(files)).encode()).hexdigest()[:16]
        found.setdefault(int(name), (name, key))  # 1 and 0001 both: the first, as version_dirs does
    return found


def exists(uri: str) -> bool:
    """Whether the last listing of ``uri`` found any object under it (listed now if never listed here)."""
    uri = uri.rstrip("/")
    if uri not in _found:
        sync(uri)
    return _found.get(uri, False)


def sync(uri: str, policy=None) -> Path:
    """Bring the mirror of ``uri`` up to date with the bucket, for the versions ``policy`` (a
    ``VersionPolicy``; None: every version) aspires to; returns the mirror directory (empty when the
    bucket holds nothing under ``uri``). A storage that cannot be read leaves the mirror as it was
    (the versions loaded keep serving, as TF Serving's do when a listing fails) and logs why once."""
    uri = uri.rstrip("/")
    mirror = mirror_dir(uri, policy)
    with _syncing, node_cache.locked(mirror.with_name(f".{mirror.name}")):  # and one process (--workers)
        try:
            tree = objstore.list_tree(uri)
            _found[uri] = bool(tree)
            remote = _remote_versions(tree)
            if policy is not None:
                chosen = policy.aspired(set(remote))
                remote = {v: remote[v] for v in chosen}
            _apply(uri, mirror, remote)
        except (objstore.StorageError, OSError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            if _last_error.get(uri) != message:
                _last_error[uri] = message
                log.error("Cannot read the versions under %s (kept the mirror %s as it was): %s", uri, mirror, message)
            return mirror
    if _last_error.pop(uri, None) is not None:
        log.info("Reading the versions under %s again", uri)
    return mirror


def _apply(uri: str, mirror: Path, remote: dict[int, tuple[str, str]]) -> None:
    entries = mirror / ENTRIES
    entries.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for version, (name, key) in remote.items():
        entry = entries / f"{name}-{key}"
        wanted.add(entry.name)
        link = mirror / name
        if os.path.realpath(link) == str(entry.resolve()) and entry.is_dir():
            continue
        if not entry.is_dir():
            log.info("Fetching version %d of %s into %s", version, uri, entry)
            node_cache.place(entry, lambda partial, name=name: _download(f"{uri}/{name}", partial))
        temp = mirror / f".{name}-{os.getpid()}-{threading.get_ident()}.link"
        temp.unlink(missing_ok=True)
        temp.symlink_to(Path(ENTRIES) / entry.name)  # relative: the mirror may be moved whole
        os.replace(temp, link)  # atomic: a loader sees the old version's files or the new ones
    names = {name for name, _key in remote.values()}
    for link in mirror.iterdir():
        if link.name.isdigit() and link.name not in names:
            link.unlink(missing_ok=True)  # removed from the bucket: the manager unloads it
    for entry in entries.iterdir():
        if not entry.name.startswith(".") and entry.name not in wanted:
            shutil.rmtree(entry, ignore_errors=True)  # replaced or removed: its servable is in memory


def _download(version_uri: str, partial: Path) -> None:
    """The version's objects into ``partial`` (node_cache.place renames it into place once whole)."""
    got = partial / "tree"
    objstore.get_tree(version_uri, got)
    for child in got.iterdir():
        child.rename(partial / child.name)
    got.rmdir()
