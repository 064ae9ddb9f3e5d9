"""Splitting a remote input by probes (``readers.split``: what the Ray engine's driver does for a
``gs://``/``s3://`` input of JSON lines, a file list or TFRecord), one layer below the engine, no Ray:

- every boundary is the first record start at or after its nominal offset, as a full sequential
  scan of the same bytes finds the records (lines longer than the probe window, CRLF, a last line
  without a newline; TFRecord records longer than the window, payloads holding newlines, bytes
  that look like a record header, and a whole TFRecord stored as a record's data);
- the chunks, each read by its own ranged read and decoded, give every row once;
- the driver's reads are the probes only, a small part of the object;
- the same object gives the same chunks on every run (a resume repeats its recorded plan).
"""
from __future__ import annotations

import bisect
import struct

import numpy as np
import pytest

from modelyard.batch import remote
from modelyard.batch.readers import UNCOUNTED, RangedSource, iter_plan, read_chunk, reader, split
from modelyard.crc32c import masked_crc
from modelyard.batch.readers.lines import next_line_start
from modelyard.batch.readers.tfrecord import next_record_start
from modelyard.batch.spec import InputFile, JobSpec
from tests.batch.conftest import Recorded


class Served(Recorded):
    """An object's bytes by ranged reads, each read recorded, as a source the plan splits by probes."""

    def source(self, name: str = "gs://bucket/input") -> RangedSource:
        return RangedSource(name, len(self.data), self, probe=True)

    def read_bytes(self) -> int:
        return sum(end - start for start, end in self.fetched)


def record(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc(length)) + payload + struct.pack("<I", masked_crc(payload))


def line_starts(data: bytes) -> list[int]:
    """Every line's start by a full sequential scan (the local engine's, one row a chunk)."""
    scanned = Served(data)
    return [start for start, _end, _rows in reader("jsonl").scan(RangedSource("x", len(data), scanned), 1)[0]]


def expected_ranges(starts: list[int], size: int, chunk: int) -> list[tuple[int, int, int]]:
    """The split's definition, from a scan's record starts: boundary k is the first start >= k * chunk."""
    bounds = [0]
    for k in range(1, size // chunk + 1):
        at = bisect.bisect_left(starts, k * chunk)
        bounds.append(starts[at] if at < len(starts) else size)
    bounds = sorted(set(bounds) | {size}) if size else []
    return [(a, b, UNCOUNTED) for a, b in zip(bounds, bounds[1:])]


def probed(data: bytes, chunk: int, next_start) -> tuple[list, Served]:
    """The split of ``data`` at a nominal ``chunk`` bytes (one record of ``chunk`` bytes a chunk)."""
    served = Served(data)
    return list(split.byte_ranges(served.source(), 1, 1, chunk, next_start)), served


LINES = [
    b"".join(b"x" * int(n) + (b"\r\n" if n % 3 == 0 else b"\n") for n in np.random.default_rng(3).integers(0, 90, 500)),
    # lines far longer than the probe window (4 KiB at this mean line) and than a chunk
    b"short\n" + b"a" * 20_000 + b"\n" + b"b\n" * 300 + b"c" * 9_000 + b"\n" + b"tail without a newline",
    b"\n" * 50,  # blank lines are rows too
]


@pytest.mark.parametrize("data", LINES, ids=["random", "long-lines", "blank"])
@pytest.mark.parametrize("chunk", [1, 7, 100, 1_000, 5_000, 10 ** 7])
def test_line_probes_find_the_scans_boundaries(data, chunk):
    ranges, _ = probed(data, chunk, next_line_start)
    assert ranges == expected_ranges(line_starts(data), len(data), chunk)


def _records() -> tuple[list[bytes], list[bytes]]:
    rng = np.random.default_rng(5)
    payloads = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(0, 400, 300)]
    inner = record(b"a record stored inside another")
    lookalike_header = struct.pack("<Q", 5) + struct.pack("<I", masked_crc(struct.pack("<Q", 5)))
    payloads[10] = b"\n" * 64 + b"{}\n" * 20  # newlines where a line format would split
    payloads[20] = inner * 6  # whole TFRecords as data: they check, but the chain from them breaks
    payloads[30] = (lookalike_header + b"12345" + b"\0\0\0\0") * 30  # headers whose data CRC fails
    payloads[40] = b"\0" * 70_000  # longer than any probe window
    payloads[41] = inner
    payloads[299] = inner  # the last record: the check that follows it is the object's end
    return payloads, [record(p) for p in payloads]


@pytest.mark.parametrize("chunk", [1, 50, 333, 4_096, 20_000, 10 ** 7])
def test_tfrecord_probes_find_the_scans_boundaries(chunk):
    _payloads, records = _records()
    data = b"".join(records)
    starts = [int(s) for s in np.cumsum([0] + [len(r) for r in records])][:-1]
    scanned = [start for start, _end, _rows in reader("tf-record").scan(RangedSource("x", len(data), Served(data)), 1)[0]]
    assert scanned == starts
    ranges, _ = probed(data, chunk, next_record_start)
    assert ranges == expected_ranges(starts, len(data), chunk)


@pytest.mark.parametrize("fmt", ["jsonl", "tf-record"])
def test_each_chunk_read_alone_gives_every_row_once_and_the_driver_reads_only_probes(fmt, tmp_path):
    """What the Ray engine does: the driver plans by probes, each actor reads its own range (here one
    ranged read per chunk, as an actor's) and counts its rows; the driver's reads are the probes."""
    rng = np.random.default_rng(8)
    if fmt == "jsonl":
        rows = [b'{"x": %d, "pad": "%s"}' % (i, b"p" * int(n)) for i, n in enumerate(rng.integers(0, 200, 40_000))]
        data = b"\n".join(rows) + b"\n"
    else:
        rows = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(0, 600, 12_000)]
        data = b"".join(record(r) for r in rows)
    served = Served(data)
    plan = list(iter_plan(["gs://bucket/input"], fmt, 500, lambda name: served.source(name)))
    chunks = [chunk for chunk, _ in plan]
    assert len(chunks) > 20 and all(not c.counted for c in chunks)
    assert chunks[0].start == 0 and chunks[-1].end == len(data)
    assert all(a.end == b.start for a, b in zip(chunks, chunks[1:]))
    # The driver: the first window (64 KiB, for the mean record) and a few KiB at each boundary.
    assert served.read_bytes() <= (64 << 10) + len(chunks) * (8 << 10), served.read_bytes()
    assert served.read_bytes() < len(data) / 5, (served.read_bytes(), len(data))
    # Each actor: its own range, one read; every row once, in order.
    decoded = []
    for chunk in chunks:
        copy = tmp_path / f"c{chunk.index}"
        with open(copy, "wb") as f:  # the actor's scratch copy: the range at its own offsets
            f.seek(chunk.start)
            f.write(data[chunk.start:chunk.end])
        found = read_chunk(chunk.__class__(**{**chunk.__dict__, "local_copy": str(copy)}), fmt, None)
        decoded += [r.instance.line if fmt == "jsonl" else r.instance["b64"] for r in found]
    if fmt == "jsonl":
        assert decoded == rows
    else:
        import base64

        assert [base64.b64decode(b) for b in decoded] == rows
    # The same object, split again (a resume): the same chunks.
    again = [chunk for chunk, _ in iter_plan(["gs://bucket/input"], fmt, 500, lambda name: Served(data).source(name))]
    assert again == chunks


def test_a_probed_chunks_row_messages_name_its_first_byte(tmp_path):
    data = b"[1]\n" * 3000 + b"not json\n" + b"[2]\n" * 10
    served = Served(data)
    chunks = [c for c, _ in iter_plan(["gs://bucket/in.jsonl"], "jsonl", 1000, lambda name: served.source(name))]
    last = next(c for c in chunks if b"not json" in data[c.start:c.end])
    assert last.start > 0
    path = tmp_path / "copy"
    path.write_bytes(data)
    rows = read_chunk(last.__class__(**{**last.__dict__, "local_copy": str(path)}), "jsonl", None)
    from modelyard.batch.readers.jsonl import parse

    bad = [parse(r.instance, last.label) for r in rows if r.instance.line == b"not json"]
    line = data[last.start:].split(b"\n").index(b"not json") + 1
    assert bad[0].message.startswith(f"gs://bucket/in.jsonl from byte {last.start:,} line {line}: not valid JSON")


def test_a_file_that_is_not_tfrecord_fails_the_probed_plan_as_the_scan_does():
    served = Served(b'{"not": "a tfrecord"}\n' * 100)
    with pytest.raises(ValueError, match="corrupt TFRecord length at byte 0 .*not a TFRecord file"):
        list(iter_plan(["gs://bucket/in.tfrecord"], "tf-record", 10, lambda name: served.source(name)))
    truncated = Served(b"".join(record(b"r" * 30) for _ in range(3))[:-5])
    with pytest.raises(ValueError, match="truncated TFRecord data: the record at byte 92 ends past the end"):
        list(iter_plan(["gs://b/t"], "tf-record", 1, lambda name: truncated.source(name)))


def test_a_job_splits_by_probes_only_the_formats_that_allow_it(tmp_path):
    """RemoteInputs (the Ray engine's reader of a job's inputs): JSON lines, file lists and TFRecord
    by probes, CSV read by the plan and kept for its actors; outside a job, a plain scan."""
    for fmt, probe in (("jsonl", True), ("file-list", True), ("tf-record", True), ("csv", False)):
        spec = JobSpec("m", 1, str(tmp_path), (InputFile("gs://b/in", 10, 1),), fmt)
        inputs = remote.RemoteInputs(spec)
        inputs._versions["gs://b/in"] = (10, "7")  # looked up: no storage needed for this check
        source = inputs("gs://b/in")
        assert source.probed is probe and (source._kept is None) is probe, fmt
    assert not remote.RemoteInputs()._probe


def test_a_probed_plan_cut_short_is_made_again_the_same_and_a_changed_object_is_refused(tmp_path):
    """Exactly-once rests on the plan's record (job_plan): a job killed mid-plan is split again on
    resume and must repeat every recorded chunk; a probed plan does, from the same bytes, and one whose
    lines moved is refused. Progress counts a probed plan's rows by rows per byte of
    its committed chunks."""
    from modelyard.batch import job_plan
    from modelyard.batch.readers import collect
    from modelyard.batch.shards import commit_part
    from modelyard.batch.spec import BatchError

    data = b"".join(b'{"x": %d}\n' % i for i in range(20_000))
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    stream = job_plan.recorded(job_dir, iter_plan(["gs://b/in"], "jsonl", 1000, lambda n: Served(data).source(n)))
    handed = [next(stream)[0] for _ in range(3)]
    stream.close()
    commit_part(job_dir, 0, [b"{}"] * 900, [b"{}"] * 100)  # chunk 0 done: its 1,000 rows counted as read
    assert job_plan.planned_rows(job_dir) == round(1000 * (handed[2].end / handed[0].end))
    # An edit that keeps every newline where it was gives the same split: what refuses it is the pin of
    # every read to the version the job was created with (test_ranged_plan's replaced object).
    changed = data.replace(b'{"x": 1', b'{"x": 9')
    other = collect(iter_plan(["gs://b/in"], "jsonl", 1000, lambda n: Served(changed).source(n)))
    shifted = collect(iter_plan(["gs://b/in"], "jsonl", 1000, lambda n: Served(b"[]\n" + data[:-3]).source(n)))
    with pytest.raises(BatchError, match="the input changed since this job started: its chunk 0"):
        job_plan.finish_partial_plan(job_dir, shifted)
    again = collect(iter_plan(["gs://b/in"], "jsonl", 1000, lambda n: Served(data).source(n)))
    assert again[0][:3] == handed and other[0] == again[0]
    assert job_plan.finish_partial_plan(job_dir, again) is True
    assert job_plan.load_plan(job_dir) == again


def test_a_corrupt_length_inside_a_probed_chunk_fails_it_saying_so():
    """Probes check only the records at each boundary, so the decoder checks every header's length CRC
    itself: a flipped length mid-chunk is named, not read past as garbage records."""
    from modelyard.batch.readers.tfrecord import decode

    records = [record(b"a" * 10), record(b"b" * 20), record(b"c" * 5)]
    data = bytearray(b"".join(records))
    at = len(records[0])
    data[at] ^= 0x01  # the second record's length, its CRC unchanged
    with pytest.raises(ValueError, match=f"corrupt TFRecord length at byte {at} of the chunk"):
        decode(bytes(data), None, "gs://b/in.tfrecord", 0)
    assert len(decode(b"".join(records), None, "gs://b/in.tfrecord", 0)) == 3
