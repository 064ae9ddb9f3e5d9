"""``--export-best-to``: the best trial's SavedModel becomes the next version of a model base path.

A trial leaves its model in ``AIP_MODEL_DIR`` (``<trial job dir>/model``), either as a
SavedModel directly or as versions (``model/0001``, what ``modelyard train --export-to``
writes). It is copied into a hidden directory beside the versions and renamed into place,
so a server watching the base path never sees half a version.
"""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path


class ExportError(RuntimeError):
    """The best trial left no SavedModel to export."""


def find_saved_model(model_dir: Path) -> Path:
    """The SavedModel a trial wrote under ``model_dir`` (its highest version if it wrote several)."""
    from modelyard.model.export import list_versions

    if (model_dir / "saved_model.pb").is_file():
        return model_dir
    versions = list_versions(model_dir)
    for version in sorted(versions, reverse=True):
        if (versions[version] / "saved_model.pb").is_file():
            return versions[version]
    raise ExportError(f"the best trial wrote no SavedModel in {model_dir} (its AIP_MODEL_DIR); save the model "
                      f"there, or use `modelyard train`, whose trials export there when --export-best-to is given")


def export_best(model_dir: Path, base_path: Path) -> Path:
    """Copy the SavedModel under ``model_dir`` to ``base_path/<latest + 1>``; returns the new dir."""
    from modelyard.model.export import list_versions, version_dir_name

    source = find_saved_model(model_dir)
    base_path.mkdir(parents=True, exist_ok=True)
    temp = base_path / f".tmp-tune-{secrets.token_hex(4)}"
    shutil.copytree(source, temp)
    try:
        for _ in range(8):
            version = max(list_versions(base_path), default=0) + 1
            final = base_path / version_dir_name(version)
            try:
                os.rename(temp, final)  # refuses a non-empty target: a concurrent export keeps its version
                return final
            except OSError:
                continue
        raise ExportError(f"could not find a free version number under {base_path}")
    finally:
        shutil.rmtree(temp, ignore_errors=True)
