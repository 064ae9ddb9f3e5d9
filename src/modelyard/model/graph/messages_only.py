"""TensorFlow's message modules without TensorFlow: the ``tensorflow`` package of the slim serving image.

TF Serving's API (``tensorflow_serving.apis``) and the SavedModel format are protocol buffers whose
generated modules live in TensorFlow's wheel (``tensorflow/core/framework/tensor_pb2.py`` ...): plain
Python, about 0.5 MB, next to 1.1 GB of runtime. ``write`` copies every ``*_pb2.py`` of a TensorFlow
wheel (or installed package) into ``site_packages``, with empty package ``__init__`` files and a top
``tensorflow/__init__.py`` that says what it is, so ``import tensorflow.core.framework.tensor_pb2`` works
and nothing of TensorFlow's runtime is there: ``choose_runtime.tensorflow_installed`` is False and
SavedModels run on the graph runtime.

    python3 -m modelyard.model.graph.messages_only TENSORFLOW_WHEEL_OR_PACKAGE_DIR SITE_PACKAGES
"""
from __future__ import annotations

import sys
import zipfile
from pathlib import Path

PACKAGE = "tensorflow"
MARKER = "MESSAGES_ONLY = True"
_INIT = f'''"""TensorFlow's generated message modules only (modelyard's slim serving image): no TensorFlow runtime.

A SavedModel is served by modelyard's TensorFlow-free graph runtime here; the image that holds
TensorFlow is modelyard-serving:full.
"""
{MARKER}


def __getattr__(name):
    raise AttributeError(f"module 'tensorflow' has no attribute {{name!r}}: this image holds TensorFlow's "
                         "message modules only (use modelyard-serving:full for TensorFlow itself)")
'''


def _members(source: Path) -> dict[str, bytes]:
    """``tensorflow/.../x_pb2.py`` -> its bytes, from a wheel or a package directory."""
    if source.is_file():
        with zipfile.ZipFile(source) as wheel:
            return {name: wheel.read(name) for name in wheel.namelist()
                    if name.startswith(PACKAGE + "/") and name.endswith("_pb2.py")}
    return {f"{PACKAGE}/{p.relative_to(source).as_posix()}": p.read_bytes() for p in source.rglob("*_pb2.py")}


def write(source: Path, site_packages: Path) -> int:
    """Write the message-only package under ``site_packages``; returns how many modules it holds."""
    members = _members(Path(source))
    if not members:
        raise SystemExit(f"{source}: no {PACKAGE}/**/*_pb2.py modules found")
    packages = set()
    for name, content in members.items():
        target = site_packages / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        parts = Path(name).parent.parts
        packages.update(Path(*parts[:i]) for i in range(1, len(parts) + 1))
    for package in packages:
        init = site_packages / package / "__init__.py"
        if not init.exists():
            init.write_text("")
    (site_packages / PACKAGE / "__init__.py").write_text(_INIT)
    return len(members)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    count = write(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{count} message modules of {PACKAGE} written under {sys.argv[2]}")
