"""The ``modelyard`` command: parses arguments and dispatches to each area's CLI module.

Each area (serving, training, edge, ...) owns a module with ``register(subparsers)``
that adds its subcommands and sets ``func`` on them; this file only wires them together.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# (module, description) of every area that contributes subcommands.
_AREAS = (
    "modelyard.serving.cli",
    "modelyard.model.cli",
    "modelyard.training.cli",
    "modelyard.edge.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelyard",
        description="Train, export, convert and serve TensorFlow models (TF Serving compatible).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _AREAS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # area not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
