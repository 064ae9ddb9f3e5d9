"""File lists: each line a path to a file whose bytes are one instance ``{"b64": ...}``.

The output's "instance" is the path (the file's bytes are the model's business, and may
be large). Relative paths are taken from the list file's directory.
"""
from __future__ import annotations

import base64
import os

import orjson

from modelyard.batch.readers.rows import BadRow, Row
from modelyard.batch.readers.lines import line_ranges, show, split_lines
from modelyard.batch.readers.source import Source, opened


def scan(file: str | Source, chunk_rows: int):
    source = opened(file)
    return line_ranges(source, chunk_rows), os.path.dirname(os.path.abspath(source.name))


def decode(data: bytes, base_dir: str, path: str, first_row: int) -> list:
    rows: list = []
    for n, line in enumerate(split_lines(data)):
        name = line.strip().decode("utf-8", "replace")
        where = f"{path} line {first_row + n + 1}"
        if not name:
            rows.append(BadRow(orjson.dumps(show(line)), f"{where}: empty line"))
            continue
        if name.startswith("file://"):
            name = name[len("file://"):]
        target = os.path.join(base_dir, name)
        try:
            with open(target, "rb") as f:
                content = f.read()
        except OSError as exc:
            rows.append(BadRow(orjson.dumps(name), f"{where}: cannot read {target}: {exc.strerror}"))
            continue
        rows.append(Row({"b64": base64.b64encode(content).decode("ascii")}, orjson.dumps(name)))
    return rows
