"""Job files in object storage: expand ``gs://``/``s3://``/local URIs, stage inputs in, publish outputs.

Jobs name their inputs and outputs by URI, as Vertex AI does. Local paths (and ``file://``) are used
in place; ``gs://`` and ``s3://`` go through fsspec (``gcsfs``/``s3fs``), so the job's own code
always sees local files. Failures a client can cause are ``ApiError``s that say which URI and why.
"""
from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

from modelyard.platform.errors import ApiError, invalid

REMOTE = ("gs", "s3")


def scheme_of(uri: str) -> str:
    """``gs``, ``s3`` or ``""`` (a local path or ``file://``); other schemes are refused."""
    scheme = urlparse(uri).scheme if "://" in uri else ""
    if scheme == "file":
        return ""
    if scheme and scheme not in REMOTE:
        raise invalid(f"{uri!r}: unsupported scheme {scheme!r} (use a local path, file://, gs:// or s3://)")
    return scheme


def local_path(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def filesystem(scheme: str):
    """The fsspec file system for ``gs``/``s3``; with a GCS emulator, anonymous and on the JSON API."""
    if scheme == "gs" and os.environ.get("STORAGE_EMULATOR_HOST"):
        # gcsfs's newer file system first asks the gRPC storage-control API for the bucket's layout,
        # which an emulator does not serve (a minute of retries per bucket): use the plain JSON API one.
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    try:
        import fsspec

        options = {"token": "anon"} if scheme == "gs" and os.environ.get("STORAGE_EMULATOR_HOST") else {}
        return fsspec.filesystem(scheme, **options)
    except ImportError as exc:
        raise ApiError("FAILED_PRECONDITION", f"{scheme}:// needs fsspec and "
                       f"{'gcsfs' if scheme == 'gs' else 's3fs'} ({exc}): pip install them beside modelyard") from None


def expand(uris: list[str]) -> list[str]:
    """Every file the URIs (paths or globs) name, in order, each once; INVALID_ARGUMENT for a URI
    that names nothing."""
    found: list[str] = []
    for uri in uris:
        scheme = scheme_of(uri)
        if scheme:
            fs = filesystem(scheme)
            try:
                matches = sorted(fs.glob(uri)) if glob.has_magic(uri) else ([uri] if fs.isfile(uri) else [])
            except Exception as exc:  # a missing bucket, a refused connection: the client learns which
                raise invalid(f"gcsSource uri {uri!r} cannot be read: {exc}") from None
            matches = [m if "://" in m else f"{scheme}://{m}" for m in matches]
        else:
            path = local_path(uri)
            if glob.has_magic(path):
                matches = sorted(m for m in glob.glob(path, recursive=True) if os.path.isfile(m))
            else:
                matches = [path] if os.path.isfile(path) else []
            matches = [os.path.abspath(m) for m in matches]
        if not matches:
            raise invalid(f"gcsSource uri {uri!r} matches no file")
        found.extend(m for m in matches if m not in found)
    return found


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
            filesystem(scheme).get(uri, str(partial))
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
        fs.put_file(str(f), f"{dest_dir.rstrip('/')}/{f.name}")


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
