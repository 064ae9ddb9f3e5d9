"""``python -m modelyard.platform [flags]``: the same as ``modelyard platform [flags]``, without building
the parsers of every other area first (some import TensorFlow, seconds the control plane never needs)."""
from __future__ import annotations

import argparse
import sys

from modelyard.platform.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelyard")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["platform", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
