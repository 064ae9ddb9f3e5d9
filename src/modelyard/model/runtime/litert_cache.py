"""LiteRT conversions that ``choose_runtime`` verified, kept on disk and keyed by the model's bytes.

Converting a SavedModel and checking LiteRT against TensorFlow costs seconds, and before that
TensorFlow's import costs 2-3 s: every batch worker paid both on every job. Once a signature is
verified, its flatbuffer and its signature are written under
``<cache>/litert/<key>/<signature>/`` (``<cache>`` as for the demo model: ``$MODELYARD_CACHE``, ...),
where ``key`` hashes every file of the version directory, TensorFlow's and LiteRT's versions and
this format's, so a changed model, converter or interpreter never finds a stale entry. An entry
is written to a temporary directory and renamed into place: readers see all of it or none. Its
signature file holds the flatbuffer's SHA-256, checked on every load (a few ms for a large model):
LiteRT trusts a flatbuffer's offsets, so a damaged file must be a miss, never an interpreter
reading out of bounds.

The cache is bounded (``$MODELYARD_LITERT_CACHE_MAX_MB``, default 2048): each write drops the
models used least recently (a load marks its model's directory used) until the rest fit; an
entry removed under a reader only costs that reader a fresh conversion.

``choose_runtime`` takes an entry instead of converting and checking again. When every signature
LiteRT can take has one, the server and batch workers load the entries alone
(``litert_first.LiteRTFirstServable``, ``choose_runtime.cached_servable``): what LiteRT refuses, and the
signatures it cannot take (classify/regress on Examples), still get TensorFlow's answer, from a
session loaded on first need.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from urllib.parse import quote


from modelyard.model.signatures import Signature, TensorSpec

log = logging.getLogger("modelyard.serving")

FORMAT = "2"  # 2: the signature file holds the flatbuffer's sha256
MODEL_FILE, SIGNATURE_FILE = "model.tflite", "signature.json"
MAX_MB_ENV, DEFAULT_MAX_MB = "MODELYARD_LITERT_CACHE_MAX_MB", 2048


def cache_root() -> Path:
    from modelyard.demo import default_cache_dir

    return default_cache_dir() / "litert"


def _versions() -> str:
    found = []
    for package in ("tensorflow", "ai-edge-litert"):
        try:
            found.append(f"{package}={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package}=none")
    return ";".join(found)


def model_key(version_dir: Path) -> str:
    """A hash of every file under ``version_dir`` (paths and bytes) and of the runtimes' versions."""
    digest = hashlib.sha256(f"format={FORMAT};{_versions()}".encode())
    for path in sorted(p for p in Path(version_dir).rglob("*") if p.is_file()):
        digest.update(b"\0" + str(path.relative_to(version_dir)).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()[:32]


def key_of(version_dir: Path) -> str | None:
    """``model_key``, or None when a file of the version cannot be read: nothing is cached for it,
    and loading the model says why."""
    try:
        return model_key(version_dir)
    except OSError:
        return None


def _entry(key: str, signature_name: str) -> Path:
    return cache_root() / key / quote(signature_name, safe="")


def _spec_json(spec: TensorSpec) -> dict:
    return {"alias": spec.alias, "tensor_name": spec.tensor_name, "dtype": spec.dtype,
            "shape": None if spec.shape is None else list(spec.shape)}


def _spec(raw: dict) -> TensorSpec:
    shape = raw["shape"]
    return TensorSpec(raw["alias"], raw["tensor_name"], int(raw["dtype"]), None if shape is None else tuple(shape))


def store(version_dir: Path, signature: Signature, content: bytes, in_keys: dict, out_keys: dict,
          key: str | None = None) -> None:
    """Keep a verified conversion of ``signature``. Never fails the caller: a cache that cannot be
    written (read-only home, full disk) only means the next load converts again."""
    if signature.defaults:
        return  # default inputs are numpy arrays; such signatures are rare and simply not cached
    key = key or key_of(version_dir)
    if key is None:
        return
    try:
        entry = _entry(key, signature.name)
        if _read(entry) is not None:
            return
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
        try:
            (staging / MODEL_FILE).write_bytes(content)
            described = {"name": signature.name, "method_name": signature.method_name,
                         "inputs": [_spec_json(s) for s in signature.inputs.values()],
                         "outputs": [_spec_json(s) for s in signature.outputs.values()],
                         "in_keys": in_keys, "out_keys": out_keys,
                         "sha256": hashlib.sha256(content).hexdigest()}
            (staging / SIGNATURE_FILE).write_text(json.dumps(described))
            shutil.rmtree(entry, ignore_errors=True)  # a damaged entry (whole ones were returned above)
            os.rename(staging, entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        prune(keep=entry.parent)
    except OSError as exc:  # includes a writer racing us to the rename: its entry is as good
        log.info("LiteRT conversion of %s not cached: %s", version_dir, exc)


def max_bytes() -> int:
    raw = os.environ.get(MAX_MB_ENV, "")
    try:
        return max(0, int(raw)) << 20 if raw else DEFAULT_MAX_MB << 20
    except ValueError:
        log.warning("%s=%r is not a number of MiB; using %d", MAX_MB_ENV, raw, DEFAULT_MAX_MB)
        return DEFAULT_MAX_MB << 20


def _size(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        try:
            total += path.stat().st_size if path.is_file() else 0
        except OSError:  # removed while we looked
            pass
    return total


def prune(keep: Path | None = None) -> list[Path]:
    """Remove the least recently used models' entries until the cache fits ``max_bytes()``; never
    ``keep`` (the model just stored). Returns what was removed."""
    models = []
    for directory in cache_root().iterdir():
        try:
            if directory.is_dir() and directory != keep:
                models.append((directory.stat().st_mtime, directory))
        except OSError:
            pass
    sizes = {directory: _size(directory) for _used, directory in models}
    total = sum(sizes.values()) + (_size(keep) if keep is not None else 0)
    limit = max_bytes()
    removed = []
    for _used, directory in sorted(models):  # least recently used first
        if total <= limit:
            break
        shutil.rmtree(directory, ignore_errors=True)
        total -= sizes[directory]
        removed.append(directory)
    if removed:
        log.info("LiteRT cache over %d MiB: removed %d model(s) used least recently", limit >> 20, len(removed))
    return removed


def _read(entry: Path) -> tuple[Signature, bytes, dict, dict] | None:
    try:
        described = json.loads((entry / SIGNATURE_FILE).read_text())
        content = (entry / MODEL_FILE).read_bytes()
        if hashlib.sha256(content).hexdigest() != described["sha256"]:
            log.warning("LiteRT cache entry %s is damaged (its flatbuffer does not match its checksum); "
                        "converting again", entry)
            return None
        signature = Signature(described["name"], described["method_name"],
                              {s["alias"]: _spec(s) for s in described["inputs"]},
                              {s["alias"]: _spec(s) for s in described["outputs"]})
        return signature, content, dict(described["in_keys"]), dict(described["out_keys"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load(version_dir: Path, signature_name: str, key: str | None = None) -> tuple[Signature, bytes, dict, dict] | None:
    """``(signature, flatbuffer, input keys, output keys)`` verified earlier for these bytes, or None.
    ``key``: ``key_of(version_dir)``, when the caller has it already."""
    key = key or key_of(Path(version_dir))
    if key is None:
        return None
    entry = _entry(key, signature_name)
    found = _read(entry)
    if found is not None:
        try:
            os.utime(entry.parent)  # used now: pruning drops the models used least recently
        except OSError:
            pass
    return found
