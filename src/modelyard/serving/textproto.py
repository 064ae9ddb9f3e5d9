"""Reading TF Serving's text-format config files (model config, monitoring, batching parameters).

One place for how a flag's file is read and how a parse error is reported, so every
config file fails the same way, naming the flag and the file.
"""
from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from modelyard.errors import invalid_argument


def parse_text_proto(text: str, proto, source: str):
    """Fill ``proto`` from protobuf text format; INVALID_ARGUMENT naming ``source`` if malformed."""
    try:
        text_format.Parse(text, proto)
    except text_format.ParseError as exc:
        raise invalid_argument(f"Invalid {source}: {exc}") from None
    return proto


def read_flag_file(path: str | Path, flag: str) -> str:
    """The text of the file a flag names; INVALID_ARGUMENT naming the flag if unreadable."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise invalid_argument(f"Cannot read {flag} {path}: {exc.strerror}") from None
