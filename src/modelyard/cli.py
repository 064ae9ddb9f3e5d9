"""The ``modelyard`` command: parses arguments and dispatches to each area's CLI module.

Each area (serving, training, edge, ...) owns a module with ``register(subparsers)``
that adds its subcommands and sets ``func`` on them; this file only wires them together.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from modelyard import _tfenv
from modelyard.cli_parser import SuggestingArgumentParser

# (module, description) of every area that contributes subcommands.
_AREAS = (
    "modelyard.serving.cli",
    "modelyard.model.cli",
    "modelyard.training.cli",
    "modelyard.edge.cli",
    "modelyard.platform.cli",
    "modelyard.batch.cli",
    "modelyard.tuning.cli",
    "modelyard.web.cli",
)
# Commands whose area is imported alone when named first: they need no TensorFlow, and the
# other areas' modules import it (seconds of start-up for a static file server).
_LIGHT_COMMANDS = {"web": "modelyard.web.cli"}


def _add_verbose(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a subcommand that was not given -v leaves the top-level count alone.
    parser.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="show TensorFlow's info logs (-vv: debug); same as MODELYARD_LOG_LEVEL=info/debug")


def build_parser(areas: tuple[str, ...] = _AREAS) -> argparse.ArgumentParser:
    parser = SuggestingArgumentParser(
        prog="modelyard",
        description="Train, export, convert and serve TensorFlow models (TF Serving compatible). "
        "TensorFlow's own info/warning logs are hidden unless -v or MODELYARD_LOG_LEVEL=info|debug.",
    )
    _add_verbose(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in areas:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # area not built yet
            raise
        module.register(sub)
    for subparser in sub.choices.values():
        _add_verbose(subparser)  # `modelyard serve -v` as well as `modelyard -v serve`
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    light = _LIGHT_COMMANDS.get(argv[0]) if argv else None
    parser = build_parser((light,) if light else _AREAS)
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", 0)
    if verbose:  # before any subcommand imports TensorFlow
        _tfenv.set_level("info" if verbose == 1 else "debug")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
