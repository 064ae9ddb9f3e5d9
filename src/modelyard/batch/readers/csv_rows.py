"""CSV with a header row: each row an instance; numbers become numbers, other cells strings.

Rows are decoded as objects keyed by the header; the job's instance shaping turns them
into arrays in header order (Vertex AI's default for CSV) unless asked for objects.
"""
from __future__ import annotations

import csv
import io

import orjson

from modelyard.batch.readers.rows import BadRow, Row
from modelyard.batch.readers.lines import line_ranges, show
from modelyard.batch.readers.source import Source, opened


def scan(file: str | Source, chunk_rows: int):
    source = opened(file)
    path = source.name
    header_range = next(line_ranges(source, 1, quoted=True), None)  # the first row only
    if header_range is None:
        return [], []  # an empty file: no header, no rows
    end = header_range[1]
    head = source.read(0, end)
    try:
        header = next(csv.reader(io.StringIO(head.decode("utf-8-sig"))))
    except (UnicodeDecodeError, StopIteration) as exc:
        raise ValueError(f"{path}: the CSV header row cannot be read ({exc})") from None
    return line_ranges(source, chunk_rows, start=end, quoted=True), header


def _cell(text: str):
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def decode(data: bytes, header: list[str], path: str, first_row: int) -> list:
    rows: list = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None:
        # Undecodable bytes: fall back to one error per physical line so no row is lost silently.
        from modelyard.batch.readers.lines import split_lines

        for n, line in enumerate(split_lines(data)):
            rows.append(BadRow(orjson.dumps(show(line)), f"{path} data row {first_row + n + 1}: not valid UTF-8"))
        return rows
    for n, cells in enumerate(csv.reader(io.StringIO(text, newline=""))):
        where = f"{path} data row {first_row + n + 1}"
        if len(cells) != len(header):
            reason = "empty line" if not cells else f"{len(cells)} fields, the header has {len(header)}"
            rows.append(BadRow(orjson.dumps(",".join(cells)), f"{where}: {reason}"))
            continue
        rows.append(Row(dict(zip(header, map(_cell, cells))), None))
    return rows
