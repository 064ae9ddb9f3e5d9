"""File lists: each line a path to a file whose bytes are one instance ``{"b64": ...}``.

The output's "instance" is the path (the file's bytes are the model's business, and may
be large). Relative paths are taken from the list file's directory. A ``gs://`` or ``s3://`` entry
(or a relative one in a list that is itself in storage) is read from storage by whoever decodes the
chunk: on Ray, the actor, on a machine that shares no disk with the driver (as Vertex AI's file
lists name Cloud Storage objects). A local entry is read on the driver's machine, where the list
names it: on Ray the driver reads a chunk's local entries and sends their bytes with the chunk
(``relay``), so a node without those files decodes it alike.
"""
from __future__ import annotations

import base64
import os
from typing import NamedTuple

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


class Relayed(NamedTuple):
    """A chunk's decode context with its local entries' bytes read where the list is (``relay``): each
    target's bytes, or the reason it could not be read."""

    base_dir: str
    files: dict[str, bytes | str]


def _name(line: bytes) -> str:
    name = line.strip().decode("utf-8", "replace")
    return name[len("file://"):] if name.startswith("file://") else name


def _target(name: str, base_dir: str) -> str:
    """Where an entry's bytes are: a URL as it is, else beside the list (its directory or its prefix)."""
    if "://" in name:
        return name
    if objstore.is_remote(base_dir) and not name.startswith("/"):
        return f"{base_dir}/{name}"
    return os.path.join(base_dir, name)  # an absolute path stays as it is


def relay(data: bytes, base_dir: str) -> Relayed:
    """``base_dir`` with the bytes of the local files the chunk ``data`` names, read here (on Ray, the
    driver: a node that shares no disk with it has none of them)."""
    files: dict[str, bytes | str] = {}
    for line in split_lines(data):
        name = _name(line)
        target = _target(name, base_dir) if name else ""
        if target and not objstore.is_remote(target) and target not in files:
            try:
                files[target] = _read(target)
            except OSError as exc:
                files[target] = str(exc.strerror or exc)
    return Relayed(base_dir, files)


def decode(data: bytes, context: str | Relayed, path: str, first_row: int) -> list:
    base_dir, relayed = (context.base_dir, context.files) if isinstance(context, Relayed) else (context, None)
    rows: list = []
    for n, line in enumerate(split_lines(data)):
        name = _name(line)
        where = f"{path} line {first_row + n + 1}"
        if not name:
            rows.append(BadRow(orjson.dumps(show(line)), f"{where}: empty line"))
            continue
        target = _target(name, base_dir)
        try:
            content = relayed[target] if relayed is not None and target in relayed else _read(target)
            if isinstance(content, str):  # the reason it could not be read where the list is
                raise OSError(content)
        except OSError as exc:
            rows.append(BadRow(orjson.dumps(name), f"{where}: cannot read {target}: {exc.strerror or exc}"))
            continue
        rows.append(Row({"b64": base64.b64encode(content).decode("ascii")}, orjson.dumps(name)))
    return rows
