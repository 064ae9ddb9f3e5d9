"""JSON Lines: each line one instance (a list, an object, or any JSON value)."""
from __future__ import annotations

import orjson

from modelyard.batch.readers import BadRow, Row
from modelyard.batch.readers.lines import line_ranges, show, split_lines


def scan(path: str, chunk_rows: int):
    return line_ranges(path, chunk_rows), None


def decode(data: bytes, context, path: str, first_row: int) -> list:
    rows: list = []
    loads = orjson.loads
    for n, line in enumerate(split_lines(data)):
        try:
            rows.append(Row(loads(line), line.strip()))
        except orjson.JSONDecodeError as exc:
            where = f"{path} line {first_row + n + 1}"
            reason = "empty line" if not line.strip() else f"not valid JSON ({exc})"
            rows.append(BadRow(orjson.dumps(show(line)), f"{where}: {reason}"))
    return rows
