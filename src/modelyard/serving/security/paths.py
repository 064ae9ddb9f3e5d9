"""``--model_roots``: every model base path must resolve inside one of the configured roots.

Requests never name files (model names and labels are keys of the manager's table), but
base paths arrive from the flags, the config file and ``HandleReloadConfigRequest``; with
roots configured, each is resolved (``..`` and symlinks followed) and refused when it
lands outside. Version directories are checked the same way, so a symlinked version that
points out of the root is refused too.
"""
from __future__ import annotations

import os
from pathlib import Path

from modelyard.errors import Code, ServingError

FLAG = "--model_roots"


def parse_roots(text: str | None) -> tuple[str, ...]:
    """``DIR[,DIR...]`` -> resolved directories; ValueError naming a root that is not a directory."""
    if not text:
        return ()
    roots = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        resolved = os.path.realpath(item)
        if not os.path.isdir(resolved):
            raise ValueError(f"{FLAG}: {item} is not a directory")
        roots.append(resolved)
    return tuple(roots)


def inside(path: str | os.PathLike, roots: tuple[str, ...]) -> bool:
    resolved = os.path.realpath(path)
    return any(resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def check_model_paths(configs, roots: tuple[str, ...]) -> None:
    """FAILED_PRECONDITION when a config's base path, or a version directory in it, escapes the roots.

    That code stops a server at start (``ModelServer.start`` re-raises it) and refuses a reload
    before any model changes.
    """
    if not roots:
        return
    for config in configs:
        if "://" in str(config.base_path):  # a gs:// base path (a URI, not a Path) is under no local root
            raise _outside(f"Model {config.name}: base path {config.base_path} is outside {FLAG} "
                           f"({', '.join(roots)}): a storage URI is not under a local root")
        base = Path(config.base_path)
        if not inside(base, roots):
            raise _outside(f"Model {config.name}: base path {base} is outside {FLAG} ({', '.join(roots)})")
        try:
            children = list(base.iterdir()) if base.is_dir() else []
        except OSError:
            children = []
        for child in children:
            if child.name.isdigit() and not inside(child, roots):
                raise _outside(
                    f"Model {config.name}: version directory {child} resolves outside {FLAG} ({', '.join(roots)})")


def _outside(message: str) -> ServingError:
    return ServingError(Code.FAILED_PRECONDITION, message)
