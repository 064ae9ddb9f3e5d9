"""File lists: each line a path to a file whose bytes are one instance ``{"b64": ...}``.

The output's "instance" is the path (the file's bytes are the model's business, and may
be large). Relative paths are taken from the list file's directory. A ``gs://`` or ``s3://`` entry
(or a relative one in a list that is itself in storage) is read from storage by whoever decodes the
chunk: on Ray, the actor, on a machine that shares no disk with the driver (as Vertex AI's file
lists name Cloud Storage objects). A local entry must be readable where the chunk is decoded.
"""
from __future__ import annotations

import base64
import os

import orjson

from modelyard import objstore
from modelyard.batch.readers.rows import BadRow, Row
from modelyard.batch.readers.lines import line_ranges, probe_ranges, show, split_lines
from modelyard.batch.readers.source import Source, opened


def scan(file: str | Source, chunk_rows: int):
    source = opened(file)
    return line_ranges(source, chunk_rows), _directory(source.name)


def probe(source: Source, chunk_rows: int):
    """``scan`` by probes (``split``): the chunks' rows are counted by whoever reads them."""
    return probe_ranges(source, chunk_rows), _directory(source.name)


def _directory(name: str) -> str:
    """Where the list's relative entries are: its own directory, or its prefix in storage."""
    if objstore.is_remote(name):
        return name.rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(name))


def _read(target: str) -> bytes:
    """An entry's bytes; OSError saying why not."""
    try:
        if not objstore.is_remote(target):
            with open(target, "rb") as f:
                return f.read()
        return objstore.read_bytes(target)
    except objstore.StorageError as exc:
        raise OSError(exc.message) from None


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
        if "://" in name:
            target = name
        elif objstore.is_remote(base_dir) and not name.startswith("/"):
            target = f"{base_dir}/{name}"
        else:
            target = os.path.join(base_dir, name)  # an absolute path stays as it is
        try:
            content = _read(target)
        except OSError as exc:
            rows.append(BadRow(orjson.dumps(name), f"{where}: cannot read {target}: {exc.strerror or exc}"))
            continue
        rows.append(Row({"b64": base64.b64encode(content).decode("ascii")}, orjson.dumps(name)))
    return rows
