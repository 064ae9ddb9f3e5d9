"""Export a Keras model as the next integer version of a model base path.

A base path holds one directory per version (``0001``, ``0002``, ...), the layout
TensorFlow Serving watches. Each export is written into a hidden temporary
directory inside the base path and renamed into place, so a server polling the
base path sees either no new version or a complete one, never half of one.
"""
from __future__ import annotations

import errno
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Callable

# Rename can lose a race with a concurrent export of the same auto-picked version;
# retrying with the next number a few times covers any realistic contention.
_MAX_RENAME_ATTEMPTS = 8


def version_dir_name(version: int) -> str:
    """``1 -> '0001'``: zero-padded so versions sort by name in a file browser."""
    return f"{version:04d}"


def list_versions(base_path: str | Path) -> dict[int, Path]:
    """Integer-named version directories under ``base_path`` (other names are ignored)."""
    base_path = Path(base_path)
    if not base_path.is_dir():
        return {}
    versions: dict[int, Path] = {}
    for entry in base_path.iterdir():
        # isascii()+isdigit() rejects hidden temp dirs, and signs, spaces and
        # non-ASCII digits that int() would accept or choke on.
        if entry.name.isascii() and entry.name.isdigit() and entry.is_dir():
            versions[int(entry.name)] = entry
    return versions


def latest_version(base_path: str | Path) -> tuple[int, Path] | None:
    """``(version, path)`` of the highest integer version under ``base_path``, or None."""
    versions = list_versions(base_path)
    if not versions:
        return None
    top = max(versions)
    return top, versions[top]


def _is_keras3(model: object) -> bool:
    return type(model).__module__.startswith("keras.")


def _is_tf_keras(model: object) -> bool:
    import tf_keras  # the Keras that tf.keras resolves to under TF_USE_LEGACY_KERAS=1

    return isinstance(model, tf_keras.Model)


def _saver(model: object) -> Callable[[Path], None]:
    """How to write ``model`` as a SavedModel with a ``serving_default`` signature.

    Checked before anything touches the disk, so a wrong argument leaves no trace.
    """
    if _is_keras3(model):
        if not callable(getattr(model, "export", None)):
            raise TypeError(f"{type(model).__qualname__} is a Keras 3 object but not a model")
        # Keras 3's exporter writes serving_default from the model's inputs itself;
        # verbose=False because its summary would name the temporary directory.
        return lambda target: model.export(str(target), verbose=False)
    if _is_tf_keras(model):
        import tensorflow as tf

        return lambda target: tf.saved_model.save(model, str(target))
    raise TypeError(
        "export() needs a Keras model (tf_keras or Keras 3), got "
        f"{type(model).__module__}.{type(model).__qualname__}"
    )


def _check_servable(export_dir: Path, model: object) -> None:
    """Fail if the export has no ``serving_default``: a server could load it but never call it."""
    from modelyard.model.savedmodel import meta_graph, read_saved_model

    signatures = meta_graph(read_saved_model(export_dir)).signature_def
    if "serving_default" not in signatures:
        raise ValueError(
            f"{type(model).__qualname__} exported without a 'serving_default' signature "
            "(is it built? give it a keras.Input or call it on a batch first)"
        )


def _check_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be a non-negative integer, got {version!r}")
    return version


def _refuse_existing(base_path: Path, version: int) -> None:
    existing = list_versions(base_path).get(version)
    if existing is not None:
        raise FileExistsError(
            f"version {version} already exists at {existing}; versions are immutable, "
            "export a new version instead (omit version= to use the next free one)"
        )


def _make_temp_dir(base_path: Path, version: int) -> Path:
    # os.mkdir (not tempfile.mkdtemp) so the final version dir gets the usual umask
    # permissions instead of 0700, and a server running as another user can read it.
    while True:
        temp = base_path / f".tmp-{version_dir_name(version)}-{secrets.token_hex(4)}"
        try:
            os.mkdir(temp)
            return temp
        except FileExistsError:
            continue


def _announce(version: int, final: Path) -> None:
    # stderr, so a script's own stdout (JSON, tables) stays clean; one line, as a notebook shows it.
    print(f"modelyard.export: exported version {version} to {final}", file=sys.stderr, flush=True)


def export(model: object, base_path: str | Path, version: int | None = None, quiet: bool = False) -> Path:
    """Export ``model`` as version ``version`` (default: latest + 1) under ``base_path``.

    Returns the new version directory, e.g. ``base_path/0002``, and says where it wrote on
    stderr unless ``quiet``. Raises TypeError if ``model`` is not a Keras model,
    FileExistsError if ``version`` already exists. Nothing is left behind on failure.
    """
    save = _saver(model)
    base_path = Path(base_path)
    explicit = version is not None
    if explicit:
        version = _check_version(version)
        _refuse_existing(base_path, version)  # fail before the (slow) save
    base_path.mkdir(parents=True, exist_ok=True)
    if version is None:
        latest = latest_version(base_path)
        version = latest[0] + 1 if latest else 1

    temp = _make_temp_dir(base_path, version)
    try:
        save(temp)
        _check_servable(temp, model)
        for _ in range(_MAX_RENAME_ATTEMPTS):
            if explicit:
                _refuse_existing(base_path, version)
            else:
                # Another export may have landed while this one was saving.
                taken = list_versions(base_path)
                if taken:
                    version = max(version, max(taken) + 1)
            final = base_path / version_dir_name(version)
            try:
                # rename(2) onto a non-empty dir fails, so a concurrent writer that won
                # the same name is never overwritten.
                os.rename(temp, final)
                if not quiet:
                    _announce(version, final)
                return final
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    raise
                if explicit:
                    raise FileExistsError(f"version {version} already exists at {final}") from exc
                version += 1
        raise FileExistsError(
            f"could not claim a new version under {base_path} after "
            f"{_MAX_RENAME_ATTEMPTS} attempts (many concurrent exports?)"
        )
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
