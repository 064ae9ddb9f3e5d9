"""Input readers, one module per format, behind one interface.

Every format splits a file into chunks of whole rows by byte range (``scan``: every row counted),
so a worker reads its chunk with one seek and the job can name each chunk for exactly-once
commits; ``decode`` turns a chunk's bytes into rows. The formats whose record starts can be told
from the bytes alone (JSON lines, file lists, TFRecord; not CSV, whose quoted fields may hold
newlines) also split an object by small reads at each nominal boundary (``probe``, see ``split``):
the plan then knows each chunk's bytes but not its rows, which whoever reads the chunk counts. A row is ``Row(instance, echo)``
(``echo``: the JSON bytes to write as the output's "instance", or None to write the
shaped instance; JSON Lines give ``RawJson`` instances, parsed only when needed) or ``BadRow(echo, message)`` for a record that cannot be read at all.

May import: ``modelyard.errors``, ``modelyard.objstore`` (a file list's entries in storage),
``modelyard.tfrecord_frames`` and ``modelyard.crc32c`` (TFRecord's framing and checksum, shared with the
warmup reader) and the standard library; nothing of the job or the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from modelyard.batch.readers.rows import BadRow, RawJson, Row
from modelyard.batch.readers.source import FileSource, RangedSource, Source
from modelyard.batch.readers.split import UNCOUNTED

__all__ = ["BadRow", "Chunk", "FileSource", "RawJson", "RangedSource", "Row", "Source", "UNCOUNTED", "check_rows",
           "collect", "iter_plan", "plan", "read_chunk", "reader", "splittable"]


@dataclass(frozen=True)
class Chunk:
    index: int  # position in the job's plan: names the committed part
    file: str
    start: int  # byte range [start, end) holding ``rows`` whole rows
    end: int
    rows: int  # UNCOUNTED for a chunk found by probes: counted by whoever reads it
    first_row: int  # 0-based row number of the first row within its file (for messages); UNCOUNTED likewise
    # Where the bytes are read from when not ``file`` itself: a node-local copy holding the range at
    # the same offsets (the Ray engine's actors, on machines that cannot see ``file``). Messages
    # still name ``file``.
    local_copy: str = ""

    @property
    def read_path(self) -> str:
        return self.local_copy or self.file

    @property
    def counted(self) -> bool:
        """Whether the plan counted this chunk's rows (False: found by probes, ``split``)."""
        return self.rows != UNCOUNTED

    @property
    def label(self) -> str:
        """How row messages name the chunk's file: with the chunk's first byte when its first row's
        number is unknown (then the rows are numbered from that byte: "x.jsonl from byte 1048576 line 3")."""
        return self.file if self.counted else f"{self.file} from byte {self.start:,}"

    @property
    def row_base(self) -> int:
        """The number of the rows before this chunk's in ``label``'s numbering."""
        return self.first_row if self.counted else 0


def reader(fmt: str):
    """The module implementing ``fmt``: ``scan(path or Source, chunk_rows) -> (ranges, context)``,
    ``decode(data, context, path, first_row) -> list[Row | BadRow]`` and, for a format whose chunks
    can be found by probes, ``probe(Source, chunk_rows) -> (ranges, context)``."""
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


def splittable(fmt: str) -> bool:
    """Whether a file of ``fmt`` can be split by probes (``split``) rather than read whole to plan it."""
    return hasattr(reader(fmt), "probe")


def iter_plan(files: list[str], fmt: str, chunk_rows: int,
              open_source: Callable[[str], Source] = FileSource) -> Iterator[tuple[Chunk, Any]]:
    """Every chunk of every file, in order, with its file's decode context (e.g. a CSV header),
    each as soon as it is found. The same files give the same chunks, so a plan cut short can be
    made again and checked against what it had handed out. ``open_source(path)`` gives a file's
    bytes: a local file by default; the Ray engine gives ranged reads of a remote one. A source
    that asks for probes (``Source.probed``: its chunks' readers read their own bytes) is split by
    the format's ``probe``; any other is scanned, every row counted."""
    module = reader(fmt)
    index = 0
    for path in files:
        source = open_source(path)
        probed = source.probed and hasattr(module, "probe")
        ranges, context = module.probe(source, chunk_rows) if probed else module.scan(source, chunk_rows)
        first = 0
        for start, end, rows in ranges:
            yield Chunk(index, path, start, end, rows, first), context
            index += 1
            first = first + rows if rows != UNCOUNTED and first != UNCOUNTED else UNCOUNTED


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
    rows = reader(fmt).decode(data, context, chunk.label, chunk.row_base)
    check_rows(chunk, len(rows))
    return rows


def check_rows(chunk: Chunk, found: int) -> None:
    """The plan counted rows when the job started; a different count means the file changed. (A chunk
    found by probes was not counted: its remote object's reads are pinned to one version instead.)"""
    if chunk.counted and found != chunk.rows:
        raise ValueError(
            f"{chunk.file} changed since the job was planned: bytes {chunk.start}-{chunk.end} hold "
            f"{found} rows, not {chunk.rows}"
        )
