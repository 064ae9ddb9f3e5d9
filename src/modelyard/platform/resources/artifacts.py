"""``artifact_uri`` -> a local SavedModel directory the replicas can load, checked.

Accepted: a local path (relative paths are taken from the platform's working directory),
``file://``, and ``gs://`` / ``s3://`` through fsspec (``gcsfs`` / ``s3fs``), copied into the
platform's state directory once per content: the copy is keyed by every object's name, generation,
checksum and size, so files changed at the same URI are a new copy, and a copy is checked against the
listing it was made from (an object rewritten meanwhile is copied again). ``gs://`` honours ``STORAGE_EMULATOR_HOST`` (a local GCS emulator), as
``google.cloud.storage`` does, which the Vertex SDK uses to stage local model directories.

A URI with a ``..`` segment is refused outright; with ``--artifact-root`` given, so is any URI not
inside one of the roots (``inside_root``, the one rule: local paths compared after resolving symlinks,
remote URIs by scheme, bucket and whole path segments, so ``gs://stage`` never admits ``gs://stage-evil``).
A remote root must name a bucket that exists when the platform starts (``missing_buckets``), as a local
root must be a directory.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from modelyard import objstore
from modelyard.platform.api.errors import ApiError, invalid

_SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
REMOTE = ("gs", "s3")


def resolve(uri: str, roots: list[str], cache_dir: Path) -> Path:
    """The checked local directory of ``uri`` (remote ones downloaded), or an ApiError saying why not."""
    if not isinstance(uri, str) or not uri:
        raise invalid("Model.artifact_uri is required: the directory holding saved_model.pb.")
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file", *REMOTE):
        raise invalid(f"artifact_uri {uri!r}: unsupported scheme {parsed.scheme!r} "
                      "(use a local path, file://, gs:// or s3://)")
    raw = parsed.path if parsed.scheme in ("file", *REMOTE) else uri
    if ".." in raw.replace("\\", "/").split("/"):
        raise invalid(f"artifact_uri {uri!r} contains '..': give the model's directory without '..'")
    if parsed.scheme in REMOTE:
        _check_roots(uri, uri, roots)
        path = _download(uri, parsed.scheme, cache_dir)
    else:
        path = Path(raw).expanduser().resolve()
        _check_roots(uri, str(path), roots)
    check_saved_model(path, uri)
    return path


def allowed_roots(raw: list[str], cwd: Path | None = None) -> list[str]:
    """``--artifact-root`` values as the platform compares them: a local one resolved against the working
    directory (``models`` from the project folder is ``<project>/models``, as the Quickstart exports it),
    remote prefixes as given. A local root that is not a directory is a ValueError saying so."""
    cwd = cwd or Path.cwd()
    out = []
    for root in raw:
        if "://" in root:
            out.append(root.rstrip("/"))
            continue
        path = (cwd / Path(root).expanduser()).resolve()
        if not path.is_dir():
            where = "" if Path(root).expanduser().is_absolute() else f" (from the working directory {cwd})"
            raise ValueError(f"--artifact-root {root}: {path}{where} is not a directory; create it, or name the "
                             f"folder your models are exported under (e.g. --artifact-root models from the project "
                             f"folder, where the Quickstart writes models/my_mnist_model)")
        out.append(str(path))
    return out


def check_remote_buckets(roots: list[str], own_storage: str | None = None) -> list[str]:
    """A remote ``--artifact-root`` is checked at start as a local one is: its bucket must exist, else a
    ValueError saying which and how to make it. Except a ``gs://`` bucket of the platform's own storage
    (``own_storage``: its URL, when the platform serves it): that storage starts with the platform, so its
    buckets can only be made afterwards (the README's ``create_bucket``); those come back as notes to print.
    A storage that cannot be asked is a ValueError too."""
    notes = []
    for root in roots:
        if "://" not in root:
            continue
        scheme, _, rest = root.partition("://")
        bucket = rest.split("/", 1)[0]
        own = scheme == "gs" and own_storage is not None
        try:
            fs = objstore.filesystem(scheme)
            fs.invalidate_cache()
            exists = bool(bucket) and fs.exists(bucket)
        except Exception as exc:  # unreachable storage, refused credentials: say so at start, not at upload
            message = exc.message if isinstance(exc, objstore.StorageError) else f"{type(exc).__name__}: {exc}"
            if own:  # the platform's own storage, just started: never a reason to stop
                notes.append(f"--artifact-root {root}: could not check the bucket gs://{bucket} ({message})")
                continue
            raise ValueError(f"--artifact-root {root}: cannot check its bucket {scheme}://{bucket}: {message}") from None
        if exists:
            continue
        if own:
            notes.append(f"--artifact-root {root}: the bucket gs://{bucket} does not exist yet in the platform's "
                         f"own Cloud Storage ({own_storage}); create it before staging models there "
                         "(storage.Client().create_bucket)")
            continue
        where = os.environ.get("STORAGE_EMULATOR_HOST", "Cloud Storage") if scheme == "gs" else \
            os.environ.get("AWS_ENDPOINT_URL", "S3")
        raise ValueError(f"--artifact-root {root}: no bucket {scheme}://{bucket} in {where}; create it, or name "
                         "the bucket your models are staged in")
    return notes


def _segments(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def inside_root(location: str, root: str) -> bool:
    """Whether ``location`` is ``root`` or under it, on whole path segments: ``gs://stage`` holds
    ``gs://stage/m/1`` but not ``gs://stage-evil/m``, ``/models`` holds ``/models/a`` but not
    ``/models-old``. Remote ones (``scheme://bucket/path``) match on scheme, bucket and path segments;
    local ones are absolute paths, already resolved by the caller (symlinks followed). The one rule
    for every root check."""
    remote, root_remote = "://" in location, "://" in root
    if remote != root_remote:
        return False
    if remote:
        scheme, _, rest = location.partition("://")
        root_scheme, _, root_rest = root.partition("://")
        if scheme.lower() != root_scheme.lower():
            return False
        location, root = rest, root_rest
    want = _segments(root)
    return _segments(location)[:len(want)] == want


def _check_roots(uri: str, location: str, roots: list[str]) -> None:
    if roots and not any(inside_root(location, r) for r in roots):
        raise ApiError("PERMISSION_DENIED", f"artifact_uri {uri!r} is outside the allowed roots "
                       f"({', '.join(roots)}): see the platform's --artifact-root")


DOWNLOAD_ATTEMPTS = 3  # objects that change while they are copied: listed and copied again


def _listing(fs, src: str) -> list[tuple[str, str, str, int]]:
    """(relative name, generation, checksum, size) of every object under ``src``, sorted: what the copy
    is keyed by. A generation (Cloud Storage) or version id / ETag (S3) changes with every write of an
    object, so a model uploaded again to the same URI is a new key, never the old copy."""
    fs.invalidate_cache(src)  # fsspec caches listings: a changed prefix must be listed again
    base = fs._strip_protocol(src).rstrip("/") + "/"
    out = []
    for path, info in fs.find(src, detail=True).items():
        name = path[len(base):] if path.startswith(base) else ""
        if not name or name.endswith("/") or info.get("type") == "directory":
            continue  # a folder placeholder holds no bytes
        generation = info.get("generation") or info.get("VersionId") or info.get("updated") or \
            info.get("LastModified") or ""
        checksum = info.get("crc32c") or info.get("md5Hash") or info.get("ETag") or ""
        out.append((name, str(generation), str(checksum), int(info.get("size") or 0)))
    return sorted(out)


def _crc32c(path: Path) -> str:
    """Cloud Storage's crc32c of a file: base64 of the big-endian checksum."""
    import base64

    import google_crc32c

    checksum = google_crc32c.Checksum()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode()


def _matches(copy: Path, listing: list[tuple[str, str, str, int]], scheme: str) -> bool:
    """The copied files are exactly the listed objects: same names and sizes, and (Cloud Storage) the
    same crc32c; an object rewritten between the listing and the copy fails this."""
    files = {p.relative_to(copy).as_posix(): p for p in copy.rglob("*") if p.is_file()}
    if set(files) != {name for name, *_ in listing}:
        return False
    for name, _generation, checksum, size in listing:
        if files[name].stat().st_size != size:
            return False
        if scheme == "gs" and checksum and _crc32c(files[name]) != checksum:
            return False
    return True


def _download(uri: str, scheme: str, cache_dir: Path) -> Path:
    """A local copy of the objects under ``uri``, cached by what they are (each object's name,
    generation, checksum and size), never by the URI alone."""
    try:
        fs = objstore.filesystem(scheme)  # FAILED_PRECONDITION when fsspec/gcsfs/s3fs are missing
        src = uri.rstrip("/")
        for _ in range(DOWNLOAD_ATTEMPTS):
            listing = _listing(fs, src)
            if not listing:
                raise invalid(f"artifact_uri {uri!r}: no such directory in object storage")
            key = hashlib.sha256(repr((src, listing)).encode()).hexdigest()[:32]
            target = cache_dir / "artifacts" / key
            if target.is_dir():
                return target
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = Path(tempfile.mkdtemp(prefix=key + ".partial-", dir=target.parent))
            try:
                fs.get(src + "/", str(temp) + "/", recursive=True)
                if not _matches(temp, listing, scheme):
                    continue  # changed while copied: list and copy again
                try:
                    temp.rename(target)  # whole or not at all
                except OSError:
                    if not target.is_dir():  # not another upload of the same objects, done first
                        raise
                return target
            finally:
                shutil.rmtree(temp, ignore_errors=True)
        raise ApiError("ABORTED", f"artifact_uri {uri!r}: its objects kept changing while they were copied "
                       f"({DOWNLOAD_ATTEMPTS} attempts); upload the model again once they are written")
    except ApiError:
        raise
    except ImportError as exc:
        raise ApiError("FAILED_PRECONDITION", f"artifact_uri {uri!r}: {exc}; pip install "
                       f"{'gcsfs' if scheme == 'gs' else 's3fs'}") from None
    except Exception as exc:  # network, permissions, missing bucket: the client sees why
        raise ApiError("FAILED_PRECONDITION", f"artifact_uri {uri!r} could not be read: {exc}") from None


def check_saved_model(path: Path, uri: str) -> None:
    """A model directory: a SavedModel, or a scikit-learn / XGBoost model file (Vertex's prebuilt images)."""
    from modelyard.model.runtime.estimators import ESTIMATOR_FILES

    if not path.is_dir():
        raise invalid(f"artifact_uri {uri!r}: no such directory {path}")
    if not any((path / f).is_file() for f in _SAVED_MODEL_FILES + ESTIMATOR_FILES):
        raise invalid(f"artifact_uri {uri!r}: {path} holds no saved_model.pb (nor model.joblib, model.pkl or "
                      "model.bst); name the SavedModel's own directory, e.g. models/my_model/0001")
