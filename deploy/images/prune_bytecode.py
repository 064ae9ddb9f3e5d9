"""Keep the compiled bytecode (.pyc) the serving image starts with, remove the rest (run in its build).

Start to first answer must stay short, so every module the server imports keeps its .pyc: this imports
modelyard's CLI, every module of modelyard.serving and modelyard.model, and the libraries those import only when
a model or request needs them; whatever that leaves in sys.modules keeps its bytecode. The standard library's
and the dependencies' other .pyc files (about two thirds of them, 18 MB) go: a module imported later anyway is
compiled from its source in memory (the image runs with PYTHONDONTWRITEBYTECODE, as a user that could not write
there), which costs milliseconds once, never correctness. A module here that fails to import fails the build.

    python3 prune_bytecode.py ROOT...
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys

PACKAGES = ("modelyard.serving", "modelyard.model")
# Imported inside functions, when the first model of their kind loads; urllib.request: the HEALTHCHECK's script.
LAZY = ("ai_edge_litert.interpreter", "urllib.request", "tensorflow_serving.apis.prediction_service_pb2_grpc",
        "tensorflow_serving.apis.model_service_pb2_grpc")


def imported() -> set[str]:
    """The real paths of the .pyc files of every module the server may import."""
    importlib.import_module("modelyard.cli")
    for name in PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, name + "."):
            importlib.import_module(module.name)
    for name in LAZY:
        importlib.import_module(name)
    return {os.path.realpath(m.__cached__) for m in list(sys.modules.values()) if getattr(m, "__cached__", None)}


def prune(roots: list[str]) -> None:
    keep = imported()
    removed = 0
    for root in roots:
        for directory, _, files in os.walk(root):
            for name in files:
                path = os.path.join(directory, name)
                # Only cached bytecode (__pycache__/), whose source is beside it: a sourceless .pyc is the module.
                cached = os.path.basename(directory) == "__pycache__" and name.endswith(".pyc")
                if cached and os.path.realpath(path) not in keep:
                    removed += os.path.getsize(path)
                    os.remove(path)
            if directory.endswith("__pycache__") and not os.listdir(directory):
                os.rmdir(directory)
    print(f"prune_bytecode: kept {len(keep)} modules' bytecode, removed {removed / 1e6:.1f} MB")


if __name__ == "__main__":
    prune(sys.argv[1:])
