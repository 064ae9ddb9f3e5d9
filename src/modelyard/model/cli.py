"""``modelyard inspect DIR [--json]``: parses the flags and prints what ``model.inspect`` finds."""
from __future__ import annotations

import argparse
import json
import sys

from modelyard.cli_parser import examples
from modelyard.model.inspect import InspectError, describe, format_text


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show a model's tag-sets, signatures, inputs and outputs",
        description=(
            "Show the tag-sets, signatures and input/output tensors (dtype, shape, name) of a "
            "SavedModel, or the input/output details of a model.tflite, like "
            "`saved_model_cli show --all`. DIR is a version directory or a model base path "
            "(then its latest integer version is shown)."
        ),
        epilog=examples("modelyard inspect models/my_mnist_model", "modelyard inspect models/my_mnist_model/0001 --json"),
    )
    parser.add_argument("dir", metavar="DIR", help="version directory or model base path")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        info = describe(args.dir)
    except (InspectError, OSError) as exc:  # OSError: e.g. an unreadable directory
        print(f"modelyard inspect: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(format_text(info), end="")
    return 0
