"""The uint8 reader (``_denselines.parse_u8``) and the part writer (``part_writer.PartWriter``).

``parse_u8`` must take exactly the lines the scalar reader takes with every value in 0..255,
and read them to the same values and spans, whichever of its two readers (64 bytes at a time
with AVX-512, or scalar) reads a line. ``PartWriter`` must write exactly the bytes it is given,
through ``O_DIRECT`` and through the page cache alike, and a failed write must leave no part.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

from modelyard.batch import dense_chunk, part_writer, work
from modelyard.batch.instances import Shaping
from modelyard.batch.part_writer import PartWriter
from modelyard.batch.predictor import Predictor, load_servable
from modelyard.batch.readers import plan
from modelyard.batch.shards import PARTS_DIR, committed

_denselines = dense_chunk._denselines
if _denselines is None:
    pytest.fail("modelyard.batch._denselines is not built: run `python3 setup.py build_ext --inplace` "
                "(needs a C compiler)", pytrace=False)


def _scalar(data: bytes, shape: tuple[int, ...], lines: int):
    """What parse_u8 must answer: the scalar int64 reader, taken only when every value fits uint8."""
    size = int(np.prod(shape))
    values, spans = np.zeros(lines * size, np.int64), np.zeros(2 * lines, np.int64)
    ok, n, after = _denselines.parse(data, 0, len(data), lines, shape, True, values, spans)
    ok = bool(ok and (values[:n * size].min(initial=0) >= 0 and values[:n * size].max(initial=0) <= 255))
    return ok, n, after, values[:n * size].astype(np.uint8), spans[:2 * n]


def _u8(data: bytes, shape: tuple[int, ...], lines: int):
    size = int(np.prod(shape))
    values, spans = np.zeros(lines * size + 64, np.uint8), np.zeros(2 * lines, np.int64)
    ok, n, after = _denselines.parse_u8(data, 0, len(data), lines, shape, values, spans)
    return bool(ok), n, after, values[:n * size], spans[:2 * n]


def _agree(data: bytes, shape: tuple[int, ...], lines: int) -> bool:
    want, got = _scalar(data, shape, lines), _u8(data, shape, lines)
    assert want[:3] == got[:3], (data, shape)
    if want[0]:
        assert np.array_equal(want[3], got[3]) and np.array_equal(want[4], got[4]), (data, shape)
    return want[0]


def _disk_full(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")


def _tiny_job(tiny_model, tmp_path: Path, rows: int):
    """The tiny model's predictor, ``rows`` input lines planned in chunks of 5,000, an empty job dir."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps([i / 10, 1, 2, 3]) + "\n" for i in range(rows)))
    chunks, _ = plan([str(src)], "jsonl", 5000)
    job = tmp_path / "job"
    job.mkdir()
    return Predictor(load_servable(tiny_model.base / "0001")), chunks, job


def test_simd_reader_is_on_where_the_cpu_has_avx512_vbmi2():
    flags = Path("/proc/cpuinfo").read_text().split()
    expected = all(f in flags for f in ("avx512f", "avx512bw", "avx512vbmi", "avx512_vbmi2"))
    assert _denselines.SIMD == int(expected)


def test_uint8_reader_agrees_with_the_scalar_reader_on_good_and_mutated_lines():
    rng = np.random.default_rng(11)
    edits = [b" ", b"\t", b"\r", b"0", b"9", b"-", b",", b"[", b"]", b".", b"e", b"00", b" 1", b"256", b"300",
             b"999", b"1000", b"x", b'"', b"\x00", b"+"]
    shapes = [(28, 28), (3,), (2, 2), (1,), (5, 7), (70,), (1, 1, 1), ()]
    accepted = 0
    for trial in range(4000):
        shape = shapes[trial % len(shapes)]
        lines = []
        for _ in range(int(rng.integers(1, 4))):
            arr = rng.integers(0, 256, size=shape)
            # compact, Python's default ", " and a few random edits, with leading/trailing blanks at times
            line = json.dumps(arr.tolist(), separators=(",", ":") if trial % 3 == 0 else None).encode()
            if trial % 3 == 2:
                line = bytearray(line)
                for _ in range(int(rng.integers(1, 4))):
                    at = int(rng.integers(0, len(line) + 1))
                    line[at:at] = edits[int(rng.integers(0, len(edits)))]
                if rng.random() < 0.3 and len(line) > 2:
                    del line[int(rng.integers(0, len(line)))]
                line = b" " * int(rng.integers(0, 3)) + bytes(line) + b" \r"[: int(rng.integers(0, 3))]
            lines.append(line)
        data = b"\n".join(lines) + (b"\n" if trial % 2 else b"")
        accepted += _agree(data, shape, len(lines))
    assert accepted > 1500  # the good lines were taken, not refused wholesale


def test_uint8_reader_at_every_alignment_and_number_length():
    """Numbers of 1, 2 and 3 digits straddling the 64-byte blocks at every offset, and the limits."""
    values = [0, 7, 10, 99, 100, 199, 200, 249, 250, 255] * 13
    for pad in range(0, 70):
        for sep in (",", ", ", " , "):
            line = (" " * pad + "[" + sep.join(map(str, values)) + "]").encode()
            assert _agree(line + b"\n", (len(values),), 1)
    for refused in ("256", "260", "299", "300", "999", "1000", "01", "00", "-1", "1.0", "1e2", "2 5"):
        line = f"[1,{refused},3]".encode()
        assert not _u8(line, (3,), 1)[0], refused
        _agree(line, (3,), 1)  # and the scalar reader (inside parse_u8) still answers as before


def test_part_writer_writes_exactly_the_bytes_given_direct_or_not(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    pieces = [bytes(rng.integers(0, 256, size=int(n), dtype=np.uint8))
              for n in [0, 1, 4095, 4096, 4097, 1 << 16, 3 << 20, 10] + list(rng.integers(1, 300_000, size=40))]
    pieces.append(bytes(9 << 20))  # larger than a buffer: the buffers grow
    expected = b"".join(pieces)
    modes = {}
    for direct in (True, False):
        with monkeypatch.context() as m:
            if not direct:
                m.delattr(os, "O_DIRECT")
            path = tmp_path / f"out-{direct}"
            out = PartWriter(path, buffer_bytes=1 << 20)
            modes[direct] = out._direct
            for piece in pieces:
                out.write(piece)
            out.close()
            assert path.read_bytes() == expected
    assert modes[False] is False
    empty = PartWriter(tmp_path / "empty")
    empty.close()
    assert (tmp_path / "empty").read_bytes() == b""


def test_a_failed_write_fails_the_chunk_and_commits_nothing(tmp_path, monkeypatch, tiny_model):
    predictor, chunks, job = _tiny_job(tiny_model, tmp_path, 5000)
    real_write = os.write

    with monkeypatch.context() as m:
        m.setattr(part_writer.os, "write", _disk_full)
        with pytest.raises(OSError, match="No space left on device"):
            work.process_chunk(job, chunks[0], "jsonl", None, Shaping(), predictor, 64)
    assert os.write is real_write
    assert committed(job) == {} and list((job / PARTS_DIR).iterdir()) == []
    assert work.process_chunk(job, chunks[0], "jsonl", None, Shaping(), predictor, 64) == (5000, 0)


def test_a_device_refusing_4k_aligned_direct_writes_gets_buffered_ones(tmp_path, monkeypatch):
    """Some devices want O_DIRECT writes aligned to more than 4 KiB: EINVAL, then the page cache."""
    real_write, refused = os.write, []

    def wants_larger_alignment(fd, data):
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(part_writer.os, "write", wants_larger_alignment)
    data = bytes(np.random.default_rng(8).integers(0, 256, size=5 << 20, dtype=np.uint8))
    out = PartWriter(tmp_path / "out", buffer_bytes=1 << 20)
    assert out._direct  # the open took O_DIRECT; the first write is refused
    for k in range(0, len(data), 100_003):
        out.write(data[k:k + 100_003])
    out.close()
    assert refused and (tmp_path / "out").read_bytes() == data and not out._direct


def test_a_chunk_reported_after_its_commit_from_the_writer_thread(tmp_path, monkeypatch, tiny_model):
    """With ``report`` (as the local engine's workers run chunks), process_chunk returns before its
    last writes; the outcome is reported only once the part is committed, and a write that fails
    there reports the error and leaves no part."""
    predictor, chunks, job = _tiny_job(tiny_model, tmp_path, 20_000)
    outcomes: dict[int, object] = {}

    def report_for(index: int):
        def report(outcome):
            # the commit is done before the report: the part is there already
            outcomes[index] = (outcome, index in committed(job))
        return report

    for chunk in chunks[:3]:
        assert work.process_chunk(job, chunk, "jsonl", None, Shaping(), predictor, 64,
                                  report=report_for(chunk.index)) is None
    part_writer.wait_finished()
    assert outcomes == {i: ((5000, 0), True) for i in range(3)}

    with monkeypatch.context() as m:
        m.setattr(part_writer.os, "write", _disk_full)
        work.process_chunk(job, chunks[3], "jsonl", None, Shaping(), predictor, 64, report=report_for(3))
        part_writer.wait_finished()
    error, was_committed = outcomes[3]
    assert isinstance(error, OSError) and "No space left on device" in str(error) and not was_committed
    assert sorted(committed(job)) == [0, 1, 2]
    assert [p.name for p in (job / PARTS_DIR).iterdir() if ".tmp-" in p.name] == []
