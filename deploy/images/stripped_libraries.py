"""Shared libraries of the wheelhouse without their symbol tables and debug sections, for the serving image.

The image has no binutils (nor should it), so the stripping happens on the host, where scripts/image made the
wheelhouse, and the build swaps the files in:

    python3 stripped_libraries.py make WHEELS OUT     (host) each wheel's .so files, `strip --strip-unneeded`,
                                                      written as OUT/<sha256 of the original>
    python3 stripped_libraries.py apply OUT SITE      (build) every .so under SITE whose content has a stripped
                                                      copy in OUT is overwritten by it

Keyed by the original's content, so a library is swapped only for the stripped copy of the very same file,
whatever version pip chose. Libraries that auditwheel vendored (`<package>.libs/`) are left as they are: patchelf
rewrote them, and strip is known to break such files. `--strip-unneeded` keeps the dynamic symbols that loading
and linking use; what goes is debug information and the static symbol table (uvloop's loop.so: 13.6 -> 1.6 MB).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# The wheels of TensorFlow, Ray and the like are not in the serving image; stripping them would only cost time.
MAX_WHEEL_BYTES = 100_000_000


def is_library(name: str) -> bool:
    """A shared library a wheel installs, but not one auditwheel vendored (patchelf rewrote those)."""
    base = name.rsplit("/", 1)[-1]
    vendored = any(part.endswith(".libs") for part in name.split("/")[:-1])
    return not vendored and (base.endswith(".so") or ".so." in base)


def make(wheels: Path, out: Path) -> None:
    """Strip each small wheel's libraries into `out` once (a marker per wheel makes a rerun cheap)."""
    out.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(wheels.glob("*.whl")):
        marker = out / f".{wheel.name}"
        if marker.exists() or wheel.stat().st_size > MAX_WHEEL_BYTES:
            continue
        with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as tmp:
            for member in archive.namelist():
                if not is_library(member):
                    continue
                data = archive.read(member)
                target = out / hashlib.sha256(data).hexdigest()
                if target.exists():
                    continue
                work = Path(tmp, "lib.so")
                work.write_bytes(data)
                done = subprocess.run(["strip", "--strip-unneeded", str(work)], capture_output=True)
                if done.returncode == 0 and work.stat().st_size < len(data):
                    work.replace(target)
        marker.touch()


def apply(stripped: Path, site: Path) -> None:
    """Overwrite each library under `site` that has a stripped copy (its mode and owner stay)."""
    saved = 0
    for root, _, files in os.walk(site):
        for name in files:
            path = Path(root, name)
            if path.is_symlink() or not is_library(str(path.relative_to(site))):
                continue
            data = path.read_bytes()
            copy = stripped / hashlib.sha256(data).hexdigest()
            if copy.exists():
                new = copy.read_bytes()
                path.write_bytes(new)
                saved += len(data) - len(new)
    print(f"stripped_libraries: {saved / 1e6:.1f} MB of symbols and debug sections removed")


if __name__ == "__main__":
    mode, first, second = sys.argv[1:4]
    {"make": make, "apply": apply}[mode](Path(first), Path(second))
