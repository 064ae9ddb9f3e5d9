"""Version directories and version policies: which versions exist on disk and which to serve.

A version is a sub-directory with an integer name (``0001`` is version 1); hidden and
other names are ignored, which lets exporters write ``.tmp-*`` dirs and rename atomically.
A base path may also be a ``gs://`` URI (a ``str``, not a ``Path``): its versions are read from a
local mirror that ``remote_versions.sync`` brings up to date each time they are listed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from modelyard.model.savedmodel import SAVED_MODEL_FILES
from modelyard.serving.manager import remote_versions

TFLITE_MODEL_FILE = "model.tflite"


def version_dirs(base_path: Path | str, policy: "VersionPolicy | None" = None) -> dict[int, Path]:
    """Integer-named sub-directories of ``base_path`` by version number. For a ``gs://`` base path: those
    of its mirror, synced now, which holds the versions ``policy`` aspires to (every one when None); the
    policy chooses the same among them as among all."""
    found: dict[int, Path] = {}
    if remote_versions.is_remote(base_path):
        base_path = remote_versions.sync(str(base_path), policy)
    try:
        entries = list(os.scandir(base_path))
    except FileNotFoundError:
        return found
    for entry in entries:
        if entry.name.isdigit() and entry.is_dir():
            found.setdefault(int(entry.name), Path(entry.path))
    return found


def missing_base_path(base_path: Path | str, setting: str = "--model_base_path") -> str | None:
    """``base path ... does not exist`` when it does not, else None: the first thing to say about a model
    that has nothing to serve (a label's version, say, cannot be available under a path that is not there).
    ``setting`` is what the user wrote the path in. A ``gs://`` one is there when its last sync found objects."""
    if remote_versions.is_remote(base_path):
        if remote_versions.exists(str(base_path)):
            return None
        return f"base path {base_path} does not exist: no object under it (check {setting} {base_path}, or upload a version)"
    if Path(base_path).exists():
        return None
    return f"base path {base_path} does not exist (check {setting} {base_path}, or create it)"


def misplaced_model(base_path: Path | str, setting: str = "--model_base_path") -> str | None:
    """Why ``base_path`` cannot be a base path because it holds a model itself, or None.

    A base path holds version directories (``1``, ``0001``, ...); pointing it at one of them, or
    at a bare SavedModel, is the most common first-hour mistake, and the fix is one line to type.
    ``setting`` is what the user wrote the path in (a flag, or the config file's ``base_path``).
    """
    if remote_versions.is_remote(base_path):
        return None  # its mirror holds version directories only
    base_path = Path(base_path)
    holds_model = any((base_path / name).is_file() for name in (*SAVED_MODEL_FILES, TFLITE_MODEL_FILE))
    if not holds_model or version_dirs(base_path):
        return None
    if base_path.name.isdigit():
        return (f"{base_path} is a version directory of {base_path.parent}: "
                f"use {setting} {base_path.parent}")
    return (f"{base_path} is a model itself, not a base path of versions: put it in a numbered version "
            f"directory (mkdir -p models/{base_path.name} && mv {base_path} models/{base_path.name}/1) "
            f"and use {setting} models/{base_path.name}")


def fingerprint(path: Path) -> tuple:
    """Sizes and mtimes of every file under ``path``: changes while a copy is still under way."""
    items = []
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:
                continue
            items.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
    return tuple(sorted(items))


@dataclass(frozen=True)
class VersionPolicy:
    """TF Serving's ServableVersionPolicy as data: kind is 'latest', 'all' or 'specific'."""

    kind: str = "latest"
    num_versions: int = 1
    versions: frozenset[int] = frozenset()

    def aspired(self, on_disk: set[int]) -> set[int]:
        if self.kind == "all":
            return set(on_disk)
        if self.kind == "specific":
            return set(on_disk) & set(self.versions)
        return set(sorted(on_disk)[-max(self.num_versions, 1):])

    @classmethod
    def from_proto(cls, policy) -> "VersionPolicy":
        """Build from a FileSystemStoragePathSourceConfig.ServableVersionPolicy message."""
        which = policy.WhichOneof("policy_choice")
        if which == "all":
            return cls("all")
        if which == "specific":
            return cls("specific", versions=frozenset(policy.specific.versions))
        if which == "latest" and policy.latest.num_versions > 0:
            return cls("latest", num_versions=policy.latest.num_versions)
        return cls()
