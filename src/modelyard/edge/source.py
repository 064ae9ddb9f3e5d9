"""Which SavedModel a conversion reads, and where a converted version is written.

``SRC`` is a version directory, a base path (its latest integer version) or
``BASE:VERSION``. The rule "integer-named directories are versions" lives in
``modelyard.model.export``; this module only parses the user's string.
"""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from modelyard.model.tflite import ConvertError
from modelyard.model.export import latest_version, list_versions, version_dir_name
from modelyard.model.savedmodel import SAVED_MODEL_FILES, TFLITE_FILE


def _is_saved_model(path: Path) -> bool:
    return any((path / name).is_file() for name in SAVED_MODEL_FILES)


def resolve_version_dir(src: str) -> Path:
    """The SavedModel directory ``src`` names (see the module docstring)."""
    path = Path(src)
    if path.is_dir() and _is_saved_model(path):
        return path
    base, sep, version = src.rpartition(":")
    if sep and version.isascii() and version.isdigit() and base:
        versions = list_versions(base)
        if int(version) not in versions:
            have = ", ".join(str(v) for v in sorted(versions)) or "none"
            raise ConvertError(f"version {int(version)} not found under {base} (versions: {have})")
        return versions[int(version)]
    if not path.exists():
        raise ConvertError(f"{src} does not exist (expected a SavedModel dir, a base path or BASE:VERSION)")
    latest = latest_version(path)
    if latest is None:
        raise ConvertError(
            f"{src} is neither a SavedModel directory (no saved_model.pb) nor a base path "
            "with integer-named version directories"
        )
    if not _is_saved_model(latest[1]):
        raise ConvertError(f"latest version {latest[1]} holds no saved_model.pb")
    return latest[1]


def write_tflite_file(data: bytes, out: Path) -> Path:
    """Write ``data`` to ``out`` via a temporary file and rename, so a failure leaves nothing."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.parent / f".{out.name}.tmp-{secrets.token_hex(4)}"
    try:
        temp.write_bytes(data)
        os.replace(temp, out)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return out


def write_tflite_version(data: bytes, base_path: Path) -> Path:
    """Place ``data`` as ``<next version>/model.tflite`` under ``base_path``; return the version dir.

    Written in a hidden directory and renamed into place, so a server watching the
    base path sees either no new version or a complete one.
    """
    base_path = Path(base_path)
    base_path.mkdir(parents=True, exist_ok=True)
    temp = base_path / f".tmp-tflite-{secrets.token_hex(4)}"
    os.mkdir(temp)
    try:
        (temp / TFLITE_FILE).write_bytes(data)
        for _ in range(8):  # another writer may claim the same number between listing and rename
            latest = latest_version(base_path)
            final = base_path / version_dir_name(latest[0] + 1 if latest else 1)
            try:
                os.rename(temp, final)
                return final
            except OSError:
                if not final.exists():
                    raise
        raise ConvertError(f"could not claim a new version under {base_path}")
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
