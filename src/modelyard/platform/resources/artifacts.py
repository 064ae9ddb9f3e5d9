"""``artifact_uri`` -> a local SavedModel directory the replicas can load, checked.

Accepted: a local path (relative paths are taken from the platform's working directory),
``file://``, and ``gs://`` / ``s3://`` through fsspec (``gcsfs`` / ``s3fs``), copied once into the
platform's state directory. ``gs://`` honours ``STORAGE_EMULATOR_HOST`` (a local GCS emulator), as
``google.cloud.storage`` does, which the Vertex SDK uses to stage local model directories.

A URI with a ``..`` segment is refused outright; with ``--artifact-root`` given, so is any URI not
inside one of the roots (local paths compared after resolving symlinks, remote URIs by prefix).
"""
from __future__ import annotations

import hashlib
import shutil
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
        _check_roots(uri, roots, lambda r: "://" in r and uri.rstrip("/").startswith(r.rstrip("/")))
        path = _download(uri, parsed.scheme, cache_dir)
    else:
        path = Path(raw).expanduser().resolve()
        _check_roots(uri, roots, lambda r: "://" not in r and (path == Path(r) or Path(r) in path.parents))
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


def _check_roots(uri: str, roots: list[str], inside) -> None:
    if roots and not any(inside(r) for r in roots):
        raise ApiError("PERMISSION_DENIED", f"artifact_uri {uri!r} is outside the allowed roots "
                       f"({', '.join(roots)}): see the platform's --artifact-root")


def _download(uri: str, scheme: str, cache_dir: Path) -> Path:
    target = cache_dir / "artifacts" / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:24]
    if target.is_dir():
        return target
    try:
        fs = objstore.filesystem(scheme)  # FAILED_PRECONDITION when fsspec/gcsfs/s3fs are missing
        src = uri.rstrip("/")
        if not fs.isdir(src):
            raise invalid(f"artifact_uri {uri!r}: no such directory in object storage")
        temp = target.with_name(target.name + ".partial")
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir(parents=True)
        fs.get(src + "/", str(temp) + "/", recursive=True)
        temp.rename(target)  # whole or not at all
    except ApiError:
        raise
    except ImportError as exc:
        raise ApiError("FAILED_PRECONDITION", f"artifact_uri {uri!r}: {exc}; pip install "
                       f"{'gcsfs' if scheme == 'gs' else 's3fs'}") from None
    except Exception as exc:  # network, permissions, missing bucket: the client sees why
        raise ApiError("FAILED_PRECONDITION", f"artifact_uri {uri!r} could not be read: {exc}") from None
    return target


def check_saved_model(path: Path, uri: str) -> None:
    """A model directory: a SavedModel, or a scikit-learn / XGBoost model file (Vertex's prebuilt images)."""
    from modelyard.model.runtime.estimators import ESTIMATOR_FILES

    if not path.is_dir():
        raise invalid(f"artifact_uri {uri!r}: no such directory {path}")
    if not any((path / f).is_file() for f in _SAVED_MODEL_FILES + ESTIMATOR_FILES):
        raise invalid(f"artifact_uri {uri!r}: {path} holds no saved_model.pb (nor model.joblib, model.pkl or "
                      "model.bst); name the SavedModel's own directory, e.g. models/my_model/0001")
