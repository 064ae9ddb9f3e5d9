"""``python -m modelyard.platform.storage --root DIR [--port 8601]``: the Cloud Storage JSON API alone
(the platform starts it this way; tests and benchmarks too)."""
from __future__ import annotations

import argparse
import sys

from modelyard.platform.storage.server import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modelyard.platform.storage",
                                     description="Serve Cloud Storage's JSON API over files under --root.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
