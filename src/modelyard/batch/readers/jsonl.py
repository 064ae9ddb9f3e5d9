"""JSON Lines: each line one instance (a list, an object, or any JSON value).

Lines are handed on unparsed (``RawJson``); ``parse`` reads one when the general path needs it.
"""
from __future__ import annotations

import orjson

from modelyard.batch.readers.rows import BadRow, RawJson, Row
from modelyard.batch.readers.lines import line_ranges, probe_ranges, show, split_lines
from modelyard.batch.readers.source import Source


def scan(file: str | Source, chunk_rows: int):
    return line_ranges(file, chunk_rows), None


def probe(source: Source, chunk_rows: int):
    """``scan`` by probes (``split``): the chunks' rows are counted by whoever reads them."""
    return probe_ranges(source, chunk_rows), None


def decode(data: bytes, context, path: str, first_row: int) -> list:
    return [Row(RawJson(line, first_row + n + 1), line.strip()) for n, line in enumerate(split_lines(data))]


def parse(raw: RawJson, path: str) -> Row | BadRow:
    try:
        return Row(orjson.loads(raw.line), raw.line.strip())
    except orjson.JSONDecodeError as exc:
        reason = "empty line" if not raw.line.strip() else f"not valid JSON ({exc})"
        return BadRow(orjson.dumps(show(raw.line)), f"{path} line {raw.row}: {reason}")
