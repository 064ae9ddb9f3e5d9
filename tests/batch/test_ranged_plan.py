"""Planning an input by ranged reads (``readers.source.RangedSource``, what the Ray engine does for a
``gs://``/``s3://`` input) gives the very plan a local file gets, and reads only as far as the plan
has got: the first chunk is handed out once its own bytes are read, never after a copy of the whole
object. Edge cases of the split: lines longer than a block, a last line without a newline, CRLF
lines, an empty input, a block ending exactly on a newline, CSV quotes across blocks, TFRecord
headers across read-ahead windows; then the real thing against modelyard's own Cloud Storage.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from modelyard import objstore
from modelyard.batch import remote
from modelyard.batch.readers import FileSource, RangedSource, iter_plan, reader, source
from modelyard.crc32c import masked_crc
from modelyard.batch.spec import InputFile, JobSpec
from tests.platform.conftest import STAGING_BUCKET
from tests.batch.conftest import Recorded

BLOCK = 16  # tiny blocks: every case crosses several of them


@pytest.fixture(autouse=True)
def tiny_blocks(monkeypatch):
    monkeypatch.setattr(source, "BLOCK", BLOCK)


def both_plans(tmp_path: Path, data: bytes, fmt: str, chunk_rows: int) -> list:
    """The format's ranges of ``data`` read locally and by ranged reads: asserted equal, returned."""
    path = tmp_path / "input"
    path.write_bytes(data)
    local_ranges, local_context = reader(fmt).scan(FileSource(str(path)), chunk_rows)
    ranged_ranges, ranged_context = reader(fmt).scan(Recorded(data).source(str(path)), chunk_rows)
    local_ranges, ranged_ranges = list(local_ranges), list(ranged_ranges)
    assert ranged_ranges == local_ranges and ranged_context == local_context
    return local_ranges


@pytest.mark.parametrize("data, chunk_rows, expected", [
    # a line longer than a block (and than the rest of its chunk): it stays whole in one chunk
    (b"a" * 40 + b"\n" + b"b\n", 1, [(0, 41, 1), (41, 43, 1)]),
    (b"a" * 40 + b"\n" + b"b\n" + b"c" * 33 + b"\n", 2, [(0, 43, 2), (43, 77, 1)]),
    # the last line has no newline: it is a row all the same, its chunk ends at the end of the input
    (b"[1]\n[2]\n[3]", 2, [(0, 8, 2), (8, 11, 1)]),
    (b"no newline at all", 5, [(0, 17, 1)]),
    # CRLF lines: the newline ends the row, the carriage return stays in it (JSON reads it as blank space)
    (b'{"a":1}\r\n{"a":2}\r\n{"a":3}', 2, [(0, 18, 2), (18, 25, 1)]),
    (b'{"a":1}\r\n{"a":2}\r\n', 1, [(0, 9, 1), (9, 18, 1)]),
    # an empty input: no chunk at all
    (b"", 3, []),
    # every block ends exactly on a newline: the boundary line belongs to the block it ends
    (b"".join(b"%015d\n" % i for i in range(5)), 1, [(16 * i, 16 * i + 16, 1) for i in range(5)]),
    (b"".join(b"%015d\n" % i for i in range(5)), 2, [(0, 32, 2), (32, 64, 2), (64, 80, 1)]),
    # a newline one byte either side of a block's end
    (b"x" * 14 + b"\n" + b"y" * 2 + b"\n", 1, [(0, 15, 1), (15, 18, 1)]),
    (b"x" * 16 + b"\n" + b"y\n", 1, [(0, 17, 1), (17, 19, 1)]),
    # blank lines are rows too (each an error line later, never dropped)
    (b"\n\n\n", 2, [(0, 2, 2), (2, 3, 1)]),
])
def test_ranged_line_plan_is_the_local_plan(tmp_path, data, chunk_rows, expected):
    assert both_plans(tmp_path, data, "jsonl", chunk_rows) == expected
    assert both_plans(tmp_path, data, "file-list", chunk_rows) == expected


def test_ranged_plan_of_random_lines_matches_for_every_chunk_size(tmp_path):
    rng = np.random.default_rng(3)
    data = b"".join(b"x" * int(n) + (b"\r\n" if n % 3 == 0 else b"\n") for n in rng.integers(0, 50, size=400))
    for tail in (b"", b"tail"):
        for chunk_rows in (1, 2, 7, 64, 399, 400, 401, 10_000):
            ranges = both_plans(tmp_path, data + tail, "jsonl", chunk_rows)
            assert sum(r for _, _, r in ranges) == 400 + bool(tail)
            assert ranges[-1][1] == len(data + tail) and ranges[0][0] == 0
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # no gap, no overlap


def test_ranged_csv_plan_keeps_quoted_newlines_across_blocks(tmp_path):
    header = b'"a long header name, quoted",b\r\n'  # longer than a block: the header is read across blocks
    rows = [b'1,"two\nlines"\n', b'3,"x"\n', b'5,"' + b"q" * 20 + b'\n' + b'""' * 5 + b'"\n', b"7,8"]
    ranges = both_plans(tmp_path, header + b"".join(rows), "csv", 1)
    starts = np.cumsum([len(header)] + [len(r) for r in rows])
    assert ranges == [(int(starts[i]), int(starts[i + 1]), 1) for i in range(4)]
    path = tmp_path / "input"
    assert reader("csv").scan(Recorded(path.read_bytes()).source(), 1)[1] == ["a long header name, quoted", "b"]


def _record(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc(length)) + payload + struct.pack("<I", masked_crc(payload))


def test_ranged_tfrecord_plan_is_the_local_plan(tmp_path):
    records = [_record(b"r" * n) for n in (0, 1, 5, 40, 3, 100, 7)]
    ranges = both_plans(tmp_path, b"".join(records), "tf-record", 2)
    assert [r for _, _, r in ranges] == [2, 2, 2, 1] and ranges[-1][1] == sum(map(len, records))
    with pytest.raises(ValueError, match="truncated TFRecord data"):
        both_plans(tmp_path, b"".join(records)[:-3], "tf-record", 2)


def test_the_first_chunk_is_planned_from_its_own_bytes(tmp_path):
    """The point of ranged planning: the first chunk is known after its own blocks, not the object's."""
    data = b"".join(b"%09d\n" % i for i in range(100))  # 1,000 bytes, 10 a line
    served = Recorded(data)
    planned = iter_plan(["gs://bucket/input"], "jsonl", 5, lambda uri: served.source(uri))
    first, _context = next(planned)
    assert (first.start, first.end, first.rows) == (0, 50, 5)
    assert max(end for _, end in served.fetched) <= 4 * BLOCK, served.fetched  # 50 bytes: 4 blocks, not 1,000
    rest = list(planned)
    assert len(rest) == 19 and rest[-1][0].end == len(data)
    # Each block once, and the last byte once more (a last line without a newline is a row).
    assert sorted(served.fetched)[:-1] == [(p, min(p + BLOCK, len(data))) for p in range(0, len(data), BLOCK)]


def test_an_object_that_shrinks_while_planned_fails_the_plan():
    data = b"[1]\n" * 40
    shrunk = Recorded(data)
    ranged = RangedSource("gs://bucket/changing", len(data) + 10, shrunk)  # looked up before it shrank
    with pytest.raises(ValueError, match="gs://bucket/changing changed while it was planned"):
        list(reader("jsonl").scan(ranged, 3)[0])


def test_gs_input_planned_by_ranged_reads_as_its_local_copy(gcs_emulator, tmp_path, monkeypatch):
    monkeypatch.setattr(source, "BLOCK", 4 << 20)  # the real block size: these are real HTTP reads
    rng = np.random.default_rng(9)
    data = b"".join(b"[" + b"1," * int(n) + b"1]\n" for n in rng.integers(0, 200, size=20_000)) + b"[2]"
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    gcs_emulator["client"].bucket(STAGING_BUCKET).blob("ranged/in.jsonl").upload_from_filename(str(path))
    uri = f"gs://{STAGING_BUCKET}/ranged/in.jsonl"
    # Uploaded behind gcsfs's back: a listing it cached in an earlier test of this process is stale.
    objstore.filesystem("gs").invalidate_cache()
    by_ranges = list(iter_plan([uri], "jsonl", 1000, remote.ranged_source))
    local = list(iter_plan([str(path)], "jsonl", 1000))
    assert [(c.start, c.end, c.rows, c.first_row) for c, _ in by_ranges] == \
        [(c.start, c.end, c.rows, c.first_row) for c, _ in local]
    assert all(c.file == uri for c, _ in by_ranges) and len(by_ranges) == 21
    last = by_ranges[-1][0]
    assert remote.read_range(uri, last.start, last.end) == data[last.start:last.end]
    with pytest.raises(ValueError, match=f"gs://{STAGING_BUCKET}/ranged/missing.jsonl.*no such bucket or object"):
        remote.ranged_source(f"gs://{STAGING_BUCKET}/ranged/missing.jsonl")


@pytest.mark.parametrize("fmt, data", [
    ("csv", b"a,b\n" + b"".join(b'%d,"x\ny"\n' % (i * 37 % 1000) for i in range(60)) + b"7,8"),
    ("jsonl", b"".join(b"[%d]\n" % (i * 37 % 1000) for i in range(60)) + b"[7]"),
    ("tf-record", b"".join(_record(b"p" * (i % 23)) for i in range(40))),
], ids=["csv", "jsonl", "tf-record"])
def test_the_plans_reads_are_the_chunks_bytes(fmt, data):
    """What the Ray engine's driver sends each actor of a remote CSV (which no probe can split: a
    quoted field may hold a newline): the bytes the plan has just read for the chunk
    (``keep``/``take``; a TFRecord record's body a header scan skips is read then), exactly the
    chunk's range, every byte of the object read once; chunks taken in order let go of what lies
    before them. (JSON lines and TFRecord are split by probes in a job, test_probe_split; kept
    here: the mechanism is the format's scan, whichever format.)"""
    served = Recorded(data)
    ranged = RangedSource("gs://bucket/input", len(data), served, keep=True)
    # A TFRecord scan reads only headers: its read-ahead (16 here, 4 MiB for real) fetches on from the
    # last one's end so the records' bodies are among the reads too.
    ranged.read_ahead = 16
    taken = []
    for chunk, context in iter_plan(["gs://bucket/input"], fmt, 7, lambda name: ranged):
        taken.append(ranged.take(chunk.start, chunk.end))
        assert taken[-1] is None or taken[-1] == data[chunk.start:chunk.end]
        assert all(at + len(kept) > chunk.end for at, kept in ranged._kept), "what lies before is let go"
    body = data[data.index(b"\n") + 1:] if fmt == "csv" else data  # a CSV's header is no chunk's
    assert len(taken) > 3 and b"".join(taken) == body
    fetched = sum(end - start for start, end in served.fetched)
    # CSV: the header's first blocks twice (read for the header, then by the rows' scan from its end).
    again = 2 * BLOCK if fmt == "csv" else 0
    assert fetched <= len(data) + 1 + again, "each byte fetched once (a last byte checked again)"
    assert not ranged._kept
    # Without keep (the plan alone: bench, tests): nothing is held.
    plain = RangedSource("gs://bucket/input", len(data), Recorded(data))
    list(iter_plan(["gs://bucket/input"], fmt, 7, lambda name: plain))
    assert plain.take(0, 4) is None


def test_a_gs_input_replaced_between_plan_and_read_fails_clearly(gcs_emulator, tmp_path):
    """Every read of a job's remote input is pinned to the generation the run looked up: replaced
    half-way through the plan's probes (or before an actor reads its chunk), the read fails saying so,
    instead of mixing rows of two versions. A changed object is refused at the start of a run too."""
    blob = gcs_emulator["client"].bucket(STAGING_BUCKET).blob("pinned/in.jsonl")
    # Longer than the plan's first window (64 KiB): the probes read on after the object is replaced.
    data = b"".join(b"[%d]\n" % i for i in range(20_000))
    blob.upload_from_string(data)
    uri = f"gs://{STAGING_BUCKET}/pinned/in.jsonl"
    size, mtime_ns, version = objstore.describe(uri)
    blob.reload()
    assert (size, version) == (len(data), str(blob.generation))
    spec = JobSpec("m", 1, str(tmp_path), (InputFile(uri, size, mtime_ns),))
    inputs = remote.RemoteInputs(spec)
    assert inputs.version(uri) == version
    planned = iter_plan([uri], "jsonl", 10, inputs)
    first, _ = next(planned)
    assert inputs.take(first) is None, "found by probes: the plan holds no chunk's bytes, its actor reads them"
    assert remote.read_range(uri, first.start, first.end, version) == data[first.start:first.end]
    blob.upload_from_string(data.replace(b"[1", b"[9"))  # same size, another generation
    with pytest.raises(ValueError, match=rf"{uri}.* changed after it was looked up: the version read is "
                                         rf"'{version}', the object's is now '\d+'"):
        list(planned)
    with pytest.raises(ValueError, match="changed after it was looked up"):
        remote.read_range(uri, first.start, first.end, version)  # what a resumed chunk's actor does
    assert remote.read_range(uri, 0, 4) == b"[0]\n"  # unpinned: the object as it is now
    # The next run of that job (a resume) looks the object up again: no longer the one it was created with.
    with pytest.raises(ValueError, match=rf"{uri} changed since the job was created: {len(data):,} bytes of "
                                         rf"{mtime_ns} then, {len(data):,} bytes of \d+ now; start a new job"):
        remote.RemoteInputs(spec).version(uri)
