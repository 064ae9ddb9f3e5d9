"""Files in object storage: expand ``gs://``/``s3://``/local URIs, stage inputs in, publish outputs.

Jobs (the platform's, and ``modelyard batch-predict``) name inputs and outputs by URI, as Vertex AI
does. Local paths (and ``file://``) are used in place; ``gs://`` and ``s3://`` go through fsspec
(``gcsfs``/``s3fs``), so a job's own code always sees local files. A GCS emulator (or the platform's
own storage) is honoured through ``STORAGE_EMULATOR_HOST``, an S3 endpoint (moto, MinIO) through
``AWS_ENDPOINT_URL``. With ``STORAGE_EMULATOR_HOST`` set, an object's metadata and ranged reads go
over plain HTTP (``gcs_json``), so a process that only reads objects never imports gcsfs.

A leaf module: it imports nothing of modelyard but ``gcs_json`` (a leaf). Failures carry a Google
status name (``StorageError.status``) so each caller can map them once into its own error type.
"""
from __future__ import annotations

import datetime as _dt
import glob
import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

from modelyard import gcs_json

REMOTE = ("gs", "s3")
_BACKEND = {"gs": "gcsfs", "s3": "s3fs"}


class StorageError(Exception):
    """A URI that cannot be used: ``status`` is a google.rpc.Code name, the message says which URI and why."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def scheme_of(uri: str) -> str:
    """``gs``, ``s3`` or ``""`` (a local path or ``file://``); other schemes are refused."""
    scheme = urlparse(uri).scheme if "://" in uri else ""
    if scheme == "file":
        return ""
    if scheme and scheme not in REMOTE:
        raise StorageError("INVALID_ARGUMENT",
                           f"{uri!r}: unsupported scheme {scheme!r} (use a local path, file://, gs:// or s3://)")
    return scheme


def is_remote(uri: str | os.PathLike) -> bool:
    return bool(scheme_of(os.fspath(uri)))


def local_path(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def filesystem(scheme: str):
    """The fsspec file system for ``gs``/``s3``; with a GCS emulator, anonymous and on the JSON API."""
    options: dict = {}
    if scheme == "gs" and os.environ.get("STORAGE_EMULATOR_HOST"):
        # gcsfs's newer file system first asks the gRPC storage-control API for the bucket's layout,
        # which an emulator does not serve (a minute of retries per bucket): use the plain JSON API one.
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        options["endpoint_url"] = os.environ["STORAGE_EMULATOR_HOST"]  # part of fsspec's cache key: one per storage
        options["token"] = "anon"
        if os.environ.get("MODELYARD_STORAGE_TOKEN"):  # a platform's storage behind --auth-token
            from google.oauth2.credentials import Credentials

            options["token"] = Credentials(os.environ["MODELYARD_STORAGE_TOKEN"])
    if scheme == "s3" and os.environ.get("AWS_ENDPOINT_URL"):
        options["client_kwargs"] = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}
    try:
        import fsspec

        return fsspec.filesystem(scheme, **options)
    except ImportError as exc:
        raise StorageError("FAILED_PRECONDITION", f"{scheme}:// needs fsspec and {_BACKEND[scheme]} ({exc}): "
                           f"pip install {_BACKEND[scheme]} beside modelyard") from None


def _remote_failure(uri: str, exc: Exception) -> StorageError:
    """One wording for every way a remote read fails (missing bucket, no credentials, refused connection)."""
    name = type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return StorageError("NOT_FOUND", f"{uri!r}: no such bucket or object ({exc})")
    if "Credential" in name or "credential" in str(exc).lower():
        return StorageError("UNAUTHENTICATED", f"{uri!r}: no usable credentials ({name}: {exc}); set them up "
                            "as gcsfs/s3fs expect (GOOGLE_APPLICATION_CREDENTIALS, AWS_ACCESS_KEY_ID ...)")
    return StorageError("INVALID_ARGUMENT", f"{uri!r} cannot be read: {name}: {exc}")


def expand(uris: list[str]) -> list[str]:
    """Every file the URIs (paths or globs) name, in order, each once; INVALID_ARGUMENT for a URI
    that names nothing. Local files come back as absolute paths, remote ones as full URIs."""
    found: list[str] = []
    for uri in uris:
        scheme = scheme_of(uri)
        if _plain_gs(scheme) and not glob.has_magic(uri):
            try:  # one object named: its metadata, without importing gcsfs (absent: gcsfs says why below)
                gcs_json.metadata(uri)
                found.extend([uri] if uri not in found else [])
                continue
            except OSError:
                pass
        if scheme:
            fs = filesystem(scheme)
            try:
                matches = sorted(fs.glob(uri)) if glob.has_magic(uri) else ([uri] if fs.isfile(uri) else [])
                if not matches and not glob.has_magic(uri):
                    fs.ls(uri.split("://", 1)[1].split("/", 1)[0])  # a missing bucket says so, not "no file"
            except Exception as exc:
                raise _remote_failure(uri, exc) from None
            matches = [m if "://" in m else f"{scheme}://{m}" for m in matches]
        else:
            path = local_path(uri)
            if glob.has_magic(path):
                matches = sorted(m for m in glob.glob(path, recursive=True) if os.path.isfile(m))
            else:
                matches = [path] if os.path.isfile(path) else []
            matches = [os.path.abspath(m) for m in matches]
        if not matches:
            raise StorageError("INVALID_ARGUMENT", f"{uri!r} matches no file")
        found.extend(m for m in matches if m not in found)
    return found


def stat(uri: str) -> tuple[int, int]:
    """``(size, modification time in ns)`` of a remote object (0 when the store gives no time)."""
    size, ns, _version = describe(uri)
    return size, ns


def describe(uri: str) -> tuple[int, int, str]:
    """``(size, modification time in ns, version)`` of a remote object: the version is what
    ``read_range`` can pin a read to (Cloud Storage's generation, S3's ETag; "" if the store gives none)."""
    try:
        scheme = scheme_of(uri)
        info = gcs_json.metadata(uri) if _plain_gs(scheme) else filesystem(scheme).info(uri)
    except StorageError:
        raise
    except Exception as exc:
        raise _remote_failure(uri, exc) from None
    when = info.get("LastModified") or info.get("updated") or info.get("mtime")
    if isinstance(when, str):
        try:
            when = _dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            when = None
    ns = int(when.timestamp() * 1e9) if isinstance(when, _dt.datetime) else 0
    version = info.get("generation") or info.get("ETag") or info.get("etag") or ""
    return int(info.get("size") or 0), ns, str(version)


def read_range(uri: str, start: int, end: int, version: str = "") -> bytes:
    """Bytes ``[start, end)`` of a remote object, in one ranged read (Cloud Storage's and S3's
    ``Range`` header): a batch job's plan and its chunks read only the bytes they need.

    ``version`` (from ``describe``) pins the read to that version of the object: Cloud Storage's
    ``generation`` parameter, S3's ``If-Match``. If the object was replaced or deleted since, the read
    fails (ABORTED, saying so) rather than return bytes of another version."""
    scheme = scheme_of(uri)
    try:
        if _plain_gs(scheme):
            return gcs_json.read_range(uri, start, end, version)
        fs = filesystem(scheme)
        if not version:
            return fs.cat_file(uri, start=start, end=end)
        if scheme == "gs":
            return fs.cat_file(uri, start=start, end=end, generation=version)
        return _s3_read_if_match(fs, uri, start, end, version)
    except StorageError:
        raise
    except Exception as exc:
        if version:
            now = _version_now(uri)
            if now != repr(version):
                raise StorageError("ABORTED", f"{uri!r} changed after it was looked up: the version read is "
                                   f"{version!r}, the object's is now {now or 'none (deleted)'}") from None
        raise _remote_failure(uri, exc) from None


def read_bytes(uri: str) -> bytes:
    """A remote object's bytes, whole (a file a file-list names)."""
    scheme = scheme_of(uri)
    try:
        return gcs_json.read(uri) if _plain_gs(scheme) else filesystem(scheme).cat_file(uri)
    except StorageError:
        raise
    except Exception as exc:
        raise _remote_failure(uri, exc) from None


def _plain_gs(scheme: str) -> bool:
    """Whether a gs:// call goes over plain HTTP (``gcs_json``: the storage at STORAGE_EMULATOR_HOST,
    no gcsfs import) rather than through gcsfs (real Cloud Storage and its credentials)."""
    return scheme == "gs" and gcs_json.endpoint() is not None


def _version_now(uri: str) -> str:
    try:
        scheme = scheme_of(uri)
        if not _plain_gs(scheme):
            filesystem(scheme).invalidate_cache(uri)  # a listing's cached entry would be the old version
        return repr(describe(uri)[2])
    except StorageError:
        return ""


def _s3_read_if_match(fs, uri: str, start: int, end: int, etag: str) -> bytes:
    """An S3 ranged GET with ``If-Match`` (s3fs's ``cat_file`` does not pass it on)."""
    from fsspec.asyn import sync

    bucket, key = uri.split("://", 1)[1].split("/", 1)

    async def get() -> bytes:
        answer = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                                   IfMatch=etag)
        try:
            return await answer["Body"].read()
        finally:
            answer["Body"].close()

    return sync(fs.loop, get)


def stage_in(files: list[str], into: Path) -> list[str]:
    """Local paths for ``files``: local ones as they are, remote ones downloaded into ``into`` once
    (a file already there whole is kept, so a resumed job sees the very same inputs)."""
    out = []
    into.mkdir(parents=True, exist_ok=True)
    for i, uri in enumerate(files):
        scheme = scheme_of(uri)
        if not scheme:
            out.append(local_path(uri))
            continue
        target = into / f"{i:05d}-{uri.rstrip('/').rsplit('/', 1)[-1]}"
        if not target.exists():
            partial = target.with_name(target.name + ".partial")
            try:
                filesystem(scheme).get(uri, str(partial))
            except StorageError:
                raise
            except Exception as exc:
                raise _remote_failure(uri, exc) from None
            partial.rename(target)  # whole or not at all
        out.append(str(target))
    return out


def publish(files: list[Path], dest_dir: str) -> None:
    """Copy ``files`` into ``dest_dir`` (a local directory or a gs:// / s3:// prefix) under their names.
    Each copy replaces the object whole, so publishing again after a crash is harmless."""
    scheme = scheme_of(dest_dir)
    if not scheme:
        target = Path(local_path(dest_dir))
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            tmp = target / f".{f.name}.partial"
            shutil.copyfile(f, tmp)
            os.replace(tmp, target / f.name)
        return
    fs = filesystem(scheme)
    for f in files:
        try:
            fs.put_file(str(f), f"{dest_dir.rstrip('/')}/{f.name}")
        except Exception as exc:
            raise _remote_failure(f"{dest_dir.rstrip('/')}/{f.name}", exc) from None


def publish_tree(root: Path, dest_dir: str) -> int:
    """Copy every file under ``root`` to ``dest_dir`` keeping relative paths; returns the count."""
    files = [f for f in sorted(root.rglob("*")) if f.is_file()]
    scheme = scheme_of(dest_dir)
    fs = filesystem(scheme) if scheme else None
    for f in files:
        rel = f.relative_to(root).as_posix()
        if fs is not None:
            fs.put_file(str(f), f"{dest_dir.rstrip('/')}/{rel}")
        else:
            target = Path(local_path(dest_dir)) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)
    return len(files)


def read_text(uri: str) -> str | None:
    """A remote object's text, None when it does not exist."""
    fs = filesystem(scheme_of(uri))
    try:
        with fs.open(uri, "rb") as f:
            return f.read().decode()
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise _remote_failure(uri, exc) from None


def list_dirs(prefix: str) -> list[str]:
    """The sub-directories (full URIs) directly under a remote ``prefix``; none when it does not exist."""
    scheme = scheme_of(prefix)
    fs = filesystem(scheme)
    try:
        entries = fs.ls(prefix.rstrip("/"), detail=True, refresh=True)
    except FileNotFoundError:
        return []
    except Exception as exc:
        raise _remote_failure(prefix, exc) from None
    return sorted(f"{scheme}://{e['name'].rstrip('/')}" for e in entries if e.get("type") == "directory")


def list_tree(prefix: str) -> dict[str, str]:
    """Every object under the remote ``prefix``: its path relative to the prefix -> a tag of its content
    (generation, checksum and size: a replaced object gets a new tag). Empty when nothing is there.
    A poll calls it each second: over plain HTTP for the storage at STORAGE_EMULATOR_HOST (one request,
    and a refused connection fails at once, where gcsfs retries for half a minute)."""
    scheme = scheme_of(prefix)
    root = prefix.split("://", 1)[1].rstrip("/")
    try:
        if _plain_gs(scheme):
            found = {f"{root.split('/', 1)[0]}/{o['name']}": o
                     for o in gcs_json.list_objects(f"{scheme}://{root}/")}
        else:
            fs = filesystem(scheme)
            fs.invalidate_cache(root)  # a poll must see what changed since the last one
            found = fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    except Exception as exc:
        raise _remote_failure(prefix, exc) from None
    tree = {}
    for name, info in found.items():
        rel = name.rstrip("/")[len(root):].lstrip("/")
        if not rel or info.get("type") == "directory":
            continue
        check = info.get("crc32c") or info.get("md5Hash") or info.get("ETag") or ""
        tree[rel] = f"{info.get('generation') or info.get('mtime') or ''}/{check}/{info.get('size') or 0}"
    return tree


def get_tree(uri: str, into: Path) -> None:
    """Download every object under the remote ``uri`` into ``into`` (made whole, then renamed)."""
    partial = into.with_name(into.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        filesystem(scheme_of(uri)).get(uri.rstrip("/") + "/", str(partial) + "/", recursive=True)
    except Exception as exc:
        shutil.rmtree(partial, ignore_errors=True)  # nothing half-downloaded stays behind
        raise _remote_failure(uri, exc) from None
    partial.rename(into)
