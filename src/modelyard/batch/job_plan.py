"""A job's plan on disk: the chunks its committed parts are named after.

A complete plan is ``plan.json`` (replaced atomically). A plan being made while workers already
predict its first chunks is recorded chunk by chunk in ``plan.partial.jsonl``, each line
written before its chunk is handed out. A job killed mid-plan is planned again on resume and
the new plan must repeat every recorded chunk (file, byte range, rows, and the file's decode
context, e.g. a CSV header): that is what makes its committed parts still name the same rows,
read the same way. A changed input fails the job instead.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from modelyard.batch.readers import Chunk, collect
from modelyard.batch.shards import committed, write_json
from modelyard.batch.spec import BatchError

PLAN_FILE = "plan.json"
PARTIAL_PLAN_FILE = "plan.partial.jsonl"


def _row(chunk: Chunk) -> list:
    return [chunk.file, chunk.start, chunk.end, chunk.rows, chunk.first_row]


def save_plan(job_dir: Path, chunks: list[Chunk], contexts: dict[str, Any]) -> None:
    write_json(job_dir / PLAN_FILE, {"chunks": [_row(c) for c in chunks], "contexts": contexts})
    (job_dir / PARTIAL_PLAN_FILE).unlink(missing_ok=True)


def load_plan(job_dir: Path) -> tuple[list[Chunk], dict[str, Any]] | None:
    """The complete plan, None when there is none yet."""
    path = job_dir / PLAN_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    chunks = [Chunk(i, *row) for i, row in enumerate(data["chunks"])]
    return chunks, data["contexts"]


class RowsPerByte:
    """The rows of a plan, for progress: those it counted, and for chunks found by probes (whose rows
    are counted as they are read) their bytes at the rows per byte of those done so far, or of the
    counted ones. ``on_change(total)`` after each ``done`` once set."""

    def __init__(self) -> None:
        self.counted = self.counted_bytes = 0
        self.uncounted: dict[int, int] = {}  # chunk index -> bytes
        self.read_rows = self.read_bytes = 0
        self.on_change: Callable[[int], None] | None = None

    def planned(self, chunk: Chunk) -> None:
        if chunk.counted:
            self.counted += chunk.rows
            self.counted_bytes += chunk.end - chunk.start
        else:
            self.uncounted[chunk.index] = chunk.end - chunk.start

    def done(self, index: int, rows: int) -> None:
        size = self.uncounted.pop(index, None)
        if size is None:
            return
        self.read_rows += rows
        self.read_bytes += size
        if self.on_change is not None:
            self.on_change(self.total())

    def total(self) -> int:
        left = sum(self.uncounted.values())
        if self.read_bytes:
            per_byte = self.read_rows / self.read_bytes
        else:
            per_byte = self.counted / self.counted_bytes if self.counted_bytes else 0.0
        return self.counted + self.read_rows + round(left * per_byte)


def planned_rows(job_dir: Path) -> int | None:
    """Rows the job's plan holds so far (the whole plan, or what a plan being made has handed
    out), for progress (chunks found by probes estimated, ``RowsPerByte``); None before the first
    chunk is planned."""
    whole = load_plan(job_dir)
    if whole is not None:
        chunks = whole[0]
    else:
        rows = _partial_rows(job_dir)
        if not rows:
            return None
        chunks = [Chunk(i, *row[:5]) for i, row in enumerate(rows)]
    rate = RowsPerByte()
    for chunk in chunks:
        rate.planned(chunk)
    for index, (ok, err, _name) in committed(job_dir).items():
        rate.done(index, ok + err)
    return rate.total()


def recorded(job_dir: Path, planned: Iterator[tuple[Chunk, Any]]) -> Iterator[tuple[Chunk, Any]]:
    """``planned`` passed through, each chunk recorded before it is handed on; ``plan.json`` once
    the plan is whole. Abandoned part-way (the job failed), the record stays partial."""
    handed: list[tuple[Chunk, Any]] = []
    fd = os.open(job_dir / PARTIAL_PLAN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        for chunk, context in planned:
            # One write per line: a kill leaves whole lines and at most one torn last line, whose
            # chunk was never handed out.
            os.write(fd, json.dumps(_row(chunk) + [context]).encode() + b"\n")
            handed.append((chunk, context))
            yield chunk, context
    finally:
        os.close(fd)
    save_plan(job_dir, *collect(handed))


def _partial_rows(job_dir: Path) -> list[list] | None:
    try:
        text = (job_dir / PARTIAL_PLAN_FILE).read_text()
    except FileNotFoundError:
        return None
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # the torn last line of a kill: its chunk was not handed out
            break
    return rows


def finish_partial_plan(job_dir: Path, whole: tuple[list[Chunk], dict[str, Any]]) -> bool:
    """When a plan was cut short, check ``whole`` (the plan made again) against its record and
    save it as the job's plan; False when nothing was cut short. BatchError when the inputs
    changed since: the committed parts would no longer name the same rows."""
    rows = _partial_rows(job_dir)
    if rows is None:
        return False
    chunks, contexts = whole
    for k, row in enumerate(rows):
        again = _row(chunks[k]) + [contexts.get(chunks[k].file)] if k < len(chunks) else None
        if again == row:
            continue
        def counted(r: list) -> str:  # a chunk split by probes (rows -1) was not counted when planned
            return f" ({r[3]} rows)" if r[3] >= 0 else ""

        if again is None or again[:5] != row[:5]:
            now = "absent" if again is None else f"{again[0]} bytes {again[1]}-{again[2]}{counted(again)}"
        else:  # same rows, another decode context: a CSV header rewritten in place
            now = f"the same bytes read with {again[5]!r} instead of {row[5]!r}"
        raise BatchError(
            f"the input changed since this job started: its chunk {k} was {row[0]} bytes {row[1]}-{row[2]}"
            f"{counted(row)}, now {now}; restore the input, or start a new job with a new --output")
    save_plan(job_dir, chunks, contexts)
    return True
