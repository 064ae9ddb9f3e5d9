"""The rows a reader gives: ``Row``, ``RawJson`` (a JSON line not parsed yet) and ``BadRow``.

Their own module so the format modules and the package's interface (``__init__``) both take
them from here: the format modules never import the package that dispatches to them.
"""
from __future__ import annotations

from typing import Any, NamedTuple


class Row(NamedTuple):
    instance: Any
    echo: bytes | None


class RawJson(NamedTuple):
    """A JSON line not parsed yet: the fast path reads a batch of them as bytes (``fastjson``)."""

    line: bytes
    row: int  # 1-based line number within its file, for error messages


class BadRow(NamedTuple):
    echo: bytes
    message: str
