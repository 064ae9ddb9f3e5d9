"""Input readers, one module per format, behind one interface.

Every format splits a file into chunks of whole rows by byte range (``scan``), so a
worker reads its chunk with one seek and the job can name each chunk for exactly-once
commits; ``decode`` turns a chunk's bytes into rows. A row is ``Row(instance, echo)``
(``echo``: the JSON bytes to write as the output's "instance", or None to write the
shaped instance; JSON Lines give ``RawJson`` instances, parsed only when needed) or ``BadRow(echo, message)`` for a record that cannot be read at all.

May import: ``modelyard.errors``, ``modelyard.objstore`` (a file list's entries in storage) and the
standard library; nothing of the job or the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from modelyard.batch.readers.rows import BadRow, RawJson, Row
from modelyard.batch.readers.source import FileSource, RangedSource, Source

__all__ = ["BadRow", "Chunk", "FileSource", "RawJson", "RangedSource", "Row", "Source", "check_rows", "collect",
           "iter_plan", "plan", "read_chunk", "reader"]


@dataclass(frozen=True)
class Chunk:
    index: int  # position in the job's plan: names the committed part
    file: str
    start: int  # byte range [start, end) holding ``rows`` whole rows
    end: int
    rows: int
    first_row: int  # 0-based row number of the first row within its file (for messages)
    # Where the bytes are read from when not ``file`` itself: a node-local copy holding the range at
    # the same offsets (the Ray engine's actors, on machines that cannot see ``file``). Messages
    # still name ``file``.
    local_copy: str = ""

    @property
    def read_path(self) -> str:
        return self.local_copy or self.file


def reader(fmt: str):
    """The module implementing ``fmt``: ``scan(path or Source, chunk_rows) -> (ranges, context)`` and
    ``decode(data, context, path, first_row) -> list[Row | BadRow]``."""
    if fmt == "jsonl":
        from modelyard.batch.readers import jsonl as module
    elif fmt == "csv":
        from modelyard.batch.readers import csv_rows as module
    elif fmt == "tf-record":
        from modelyard.batch.readers import tfrecord as module
    elif fmt == "file-list":
        from modelyard.batch.readers import file_list as module
    else:
        raise ValueError(f"unknown format {fmt}")
    return module


def iter_plan(files: list[str], fmt: str, chunk_rows: int,
              open_source: Callable[[str], Source] = FileSource) -> Iterator[tuple[Chunk, Any]]:
    """Every chunk of every file, in order, with its file's decode context (e.g. a CSV header),
    each as soon as it is found. The same files give the same chunks, so a plan cut short can be
    made again and checked against what it had handed out. ``open_source(path)`` gives a file's
    bytes: a local file by default; the Ray engine gives ranged reads of a remote one, read only as
    far as the plan has got (one planning rule for every file, wherever its bytes are)."""
    module = reader(fmt)
    index = 0
    for path in files:
        ranges, context = module.scan(open_source(path), chunk_rows)
        first = 0
        for start, end, rows in ranges:
            yield Chunk(index, path, start, end, rows, first), context
            index += 1
            first += rows


def collect(planned: Iterable[tuple[Chunk, Any]]) -> tuple[list[Chunk], dict[str, Any]]:
    """A plan's ``(chunk, context)`` pairs as a whole plan: the chunks, and each file's context."""
    chunks: list[Chunk] = []
    contexts: dict[str, Any] = {}
    for chunk, context in planned:
        chunks.append(chunk)
        contexts[chunk.file] = context
    return chunks, contexts


def plan(files: list[str], fmt: str, chunk_rows: int) -> tuple[list[Chunk], dict[str, Any]]:
    """``iter_plan`` whole: the chunks, and the context of each file that has any."""
    return collect(iter_plan(files, fmt, chunk_rows))


def read_chunk(chunk: Chunk, fmt: str, context: Any) -> list[Row | BadRow]:
    with open(chunk.read_path, "rb") as f:
        f.seek(chunk.start)
        data = f.read(chunk.end - chunk.start)
    rows = reader(fmt).decode(data, context, chunk.file, chunk.first_row)
    check_rows(chunk, len(rows))
    return rows


def check_rows(chunk: Chunk, found: int) -> None:
    """The plan counted rows when the job started; a different count means the file changed."""
    if found != chunk.rows:
        raise ValueError(
            f"{chunk.file} changed since the job was planned: bytes {chunk.start}-{chunk.end} hold "
            f"{found} rows, not {chunk.rows}"
        )
