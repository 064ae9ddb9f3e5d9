"""The C path for numeric JSON lines (``_denselines`` via ``dense_chunk``) writes the general loop's bytes.

Each input file is run three ways through the real ``work.process_chunk`` with a real model:
the C path; the Python loop with its NumPy fast path (``_denselines`` absent, as when built
without a compiler); and the plain row-by-row loop (no fast path at all). The C path must
write byte for byte what the Python loop writes, for good lines, bad lines, numbers the C
parser leaves to Python, and batches the model refuses.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import orjson
import pytest

import modelyard
from modelyard.batch import dense_chunk, work
from modelyard.batch.instances import Shaping
from modelyard.batch.predictor import Predictor, load_servable
from modelyard.batch.readers import plan
from modelyard.batch.readers.lines import split_lines
from modelyard.batch.shards import PARTS_DIR
from tests.batch.conftest import rows

_denselines = dense_chunk._denselines
if _denselines is None:
    pytest.fail("modelyard.batch._denselines is not built: run `python3 setup.py build_ext --inplace` "
                "(needs a C compiler)", pytrace=False)


@pytest.fixture(scope="module")
def pixel_model(tmp_path_factory) -> Path:
    """A uint8 [2, 3] -> 2 model (an image model's input type), base path with version 0001."""
    import tensorflow as tf

    keras = tf.keras
    keras.utils.set_random_seed(3)
    inputs = keras.Input((2, 3), dtype="uint8", name="pixels")
    scaled = keras.layers.Rescaling(1 / 255)(inputs)
    outputs = keras.layers.Dense(2)(keras.layers.Flatten()(scaled))
    base = tmp_path_factory.mktemp("models") / "pixels"
    modelyard.export(keras.Model(inputs, outputs), base)
    return base


def _predictor(base: Path) -> Predictor:
    return Predictor(load_servable(base / "0001"))


def _run(predictor: Predictor, src: Path, job_dir: Path, batch_size: int) -> list[tuple[str, bytes]]:
    """Every part file ``process_chunk`` commits for ``src`` (chunks of 7 rows), name and bytes."""
    job_dir.mkdir()
    chunks, _ = plan([str(src)], "jsonl", 7)
    for chunk in chunks:
        work.process_chunk(job_dir, chunk, "jsonl", None, Shaping(), predictor, batch_size)
    parts = job_dir / PARTS_DIR
    return sorted((p.name, p.read_bytes()) for p in parts.iterdir())


def _three_ways(predictor: Predictor, lines: list[str], tmp_path: Path, monkeypatch, batch_size: int = 4):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    fast = _run(predictor, src, tmp_path / "c", batch_size)
    with monkeypatch.context() as m:
        m.setattr(dense_chunk, "_denselines", None)
        numpy_path = _run(predictor, src, tmp_path / "numpy", batch_size)
        m.setattr(predictor, "dense", None)
        general = _run(predictor, src, tmp_path / "general", batch_size)
    return fast, numpy_path, general


def _same_rows(parts, general) -> None:
    """The row-by-row loop batches only the rows that parse, so its error lines may come in another
    order; its results and its set of error lines must be the same."""
    def split(found):
        results = [b for name, b in found if name.endswith(".results")]
        errors = sorted(line for name, b in found if name.endswith(".errors") for line in b.splitlines())
        return results, errors

    assert split(parts) == split(general)


def _counts(parts) -> tuple[int, int]:
    ok = sum(b.count(b"\n") for name, b in parts if name.endswith(".results"))
    err = sum(b.count(b"\n") for name, b in parts if name.endswith(".errors"))
    return ok, err


FLOAT_GOOD = [
    "[0.1, -2.5, 300, 0.001]",
    "  [1,2,3,4]\t ",
    "[-0, 0, -0.0, 5]\r",
    "[0.30000000000000004, 1.7976931348623157e308, 5e-324, -1e-7]",  # past the exact fast path
    "[123456789012345, 1.5E3, 2e-2, 0.000000000000000000000000001]",
    "[ 9007199254740992 , 1 , 2 , 3 ]",
]
FLOAT_PYTHON_ONLY = [  # lines the C parser leaves to the Python loop (which may accept them)
    "[1e+2, 1, 2, 3]",
    "[01, 1., 2, 3]",
    "[12345678901234567890123, 1, 2, 3]",
    "[1e400, 1, 2, 3]",
    "[9007199254740993, 1, 2, 3]",
]
BAD = [
    "",
    "not json",
    "[1,2,3]",
    "[[1,2,3,4]]",
    "[1,2,3,4] 5",
    '["a",2,3,4]',
    "[true,2,3,4]",
    "[null,2,3,4]",
    "[1,2,3,4",
    '{"x": [1, 2, 3, 4]}',  # an object naming the input: the general loop takes it
    '{"y": [1, 2, 3, 4]}',
]


def test_float_lines_give_the_python_loops_bytes(tiny_model, tmp_path, monkeypatch):
    predictor = _predictor(tiny_model.base)
    good = [json.dumps(r.tolist()) for r in rows(30, seed=11)] + FLOAT_GOOD
    lines = good[:20] + BAD[:4] + good[20:30] + FLOAT_PYTHON_ONLY + BAD[4:] + good[30:]
    fast, numpy_path, general = _three_ways(predictor, lines, tmp_path, monkeypatch)
    assert fast == numpy_path
    ok, err = _counts(fast)
    # Every row once; the object naming the input and [true,...] (bools are numbers to NumPy) are good rows.
    assert ok + err == len(lines) and err >= len(BAD) - 2
    errors = b"".join(b for name, b in fast if name.endswith(".errors"))
    assert b'"status":"INVALID_ARGUMENT"' in errors and b"line 21: empty line" in errors
    # With strict JSON numbers only, the plain row-by-row loop agrees too (its leniency differs).
    (tmp_path / "strict").mkdir()
    fast, numpy_path, general = _three_ways(predictor, good + BAD, tmp_path / "strict", monkeypatch)
    assert fast == numpy_path
    _same_rows(fast, general)


def test_integer_lines_give_the_python_loops_bytes(pixel_model, tmp_path, monkeypatch):
    predictor = _predictor(pixel_model)
    images = np.random.default_rng(2).integers(0, 256, size=(25, 2, 3))
    good = [json.dumps(img.tolist(), separators=(",", ":")) for img in images]
    good += ["[[-1, 0, 255], [256, 300, -300]]", "[[0,0,0],[0,0,-0]]", "[ [ 1 ,2,3] ,[4,5, 6 ] ]"]
    python_only = ["[[1.5,0,0],[0,0,0]]", "[[1e2,0,0],[0,0,0]]", "[[99999999999999999999,0,0],[0,0,0]]",
                   "[[01,0,0],[0,0,0]]"]
    bad = ["[[1,2,3]]", "[[1,2,3],[4,5]]", '[["a",0,0],[0,0,0]]', "[]", "[[1,2,3],[4,5,6]],"]
    lines = good[:9] + python_only + good[9:17] + bad + good[17:]
    fast, numpy_path, general = _three_ways(predictor, lines, tmp_path, monkeypatch, batch_size=5)
    assert fast == numpy_path
    ok, err = _counts(fast)
    assert ok + err == len(lines) and err >= len(bad)
    errors = b"".join(b for name, b in fast if name.endswith(".errors"))
    assert b"1.5 not of type uint8" in errors  # a fraction for an integer input: the general loop's words
    (tmp_path / "strict").mkdir()
    fast, numpy_path, general = _three_ways(predictor, good + bad, tmp_path / "strict", monkeypatch, batch_size=5)
    assert fast == numpy_path
    _same_rows(fast, general)


def test_a_chunk_without_a_final_newline_and_with_crlf_lines(tiny_model, tmp_path, monkeypatch):
    predictor = _predictor(tiny_model.base)
    src = tmp_path / "in.jsonl"
    # batches of 2: a blank line fails the first (taken row by row); padded lines pass the second
    src.write_bytes(b"[1,2,3,4]\r\n \t\r\n [5,6,7,8]\r\n\t[0.5,0.25,0,1] ")
    fast = _run(predictor, src, tmp_path / "c", 2)
    with monkeypatch.context() as m:
        m.setattr(dense_chunk, "_denselines", None)
        assert _run(predictor, src, tmp_path / "numpy", 2) == fast
    assert _counts(fast) == (3, 1)
    results = b"".join(b for name, b in fast if name.endswith(".results"))
    assert results.startswith(b'{"instance":[1,2,3,4],"prediction":[')
    assert b'{"instance":[5,6,7,8],' in results and b'{"instance":[0.5,0.25,0,1],' in results


def test_a_changed_file_fails_the_chunk_as_before(tiny_model, tmp_path, monkeypatch):
    predictor = _predictor(tiny_model.base)
    src = tmp_path / "in.jsonl"
    src.write_text("[1,2,3,4]\n" * 7)
    chunks, _ = plan([str(src)], "jsonl", 7)
    src.write_text("[1,2,3,4]\n" * 5 + "[1,2,3,4,5,6,7,8,9,10,11,12]\n")  # bytes 0-70 now hold 6 rows
    messages = []
    for disabled in (False, True):
        with monkeypatch.context() as m:
            if disabled:
                m.setattr(dense_chunk, "_denselines", None)
            job_dir = tmp_path / f"job{disabled}"
            job_dir.mkdir()
            with pytest.raises(ValueError) as caught:
                work.process_chunk(job_dir, chunks[0], "jsonl", None, Shaping(), predictor, 4)
            messages.append(str(caught.value))
            parts = job_dir / PARTS_DIR
            assert not (parts.exists() and list(parts.iterdir())), "nothing half-written"
    assert messages[0] == messages[1]
    assert messages[0].endswith("bytes 0-70 hold 6 rows, not 7")
    src.write_text("[1,2,3,4]\n" * 3)  # cut short: the same words again
    messages = []
    for disabled in (False, True):
        with monkeypatch.context() as m:
            if disabled:
                m.setattr(dense_chunk, "_denselines", None)
            job_dir = tmp_path / f"short{disabled}"
            job_dir.mkdir()
            with pytest.raises(ValueError) as caught:
                work.process_chunk(job_dir, chunks[0], "jsonl", None, Shaping(), predictor, 4)
            messages.append(str(caught.value))
    assert messages[0] == messages[1] and messages[0].endswith("bytes 0-70 hold 3 rows, not 7")


def _parse(lines: list[bytes], shape: tuple[int, ...], integer: bool):
    data = bytearray(b"\n".join(lines) + b"\n")
    size = math.prod(shape)
    values = np.zeros(len(lines) * size, np.int64)
    spans = np.zeros(2 * len(lines), np.int64)
    ok, n, after = _denselines.parse(data, 0, len(data), len(lines), shape, integer, values, spans)
    assert n == len(lines) and after == len(data)
    return ok, values if integer else values.view(np.float64), spans, data


def test_parse_reads_floats_exactly_as_numpy_does():
    rng = np.random.default_rng(0)
    numbers = np.concatenate([rng.normal(size=300) * 10.0 ** rng.integers(-30, 30, size=300),
                              rng.integers(-10**6, 10**6, size=100).astype(np.float64), [0.0, -0.0, 1e-300]])
    spellings = [repr(float(v)) for v in numbers] + [f"{v:.17g}" for v in numbers] + [f"{v:.3e}" for v in numbers]
    spellings = [s for s in spellings if "+" not in s and "inf" not in s and "nan" not in s
                 and not (s.lstrip("-").isdigit() and abs(int(s)) > 2**53)]  # refused: see below
    spellings = spellings[: len(spellings) // 4 * 4]
    lines = [("[" + ",".join(spellings[i:i + 4]) + "]").encode() for i in range(0, len(spellings), 4)]
    ok, values, spans, data = _parse(lines, (4,), False)
    assert ok
    expected = np.fromstring(b",".join(line.strip(b"[]") for line in lines), dtype=np.float64, sep=",")
    assert values.tobytes() == expected.tobytes()  # bit for bit, signs of zeros included
    assert [bytes(data[s:e]) for s, e in spans.reshape(-1, 2)] == [line.strip() for line in lines]


def test_parse_refuses_what_it_cannot_read_exactly():
    for text in [b"[1e+2]", b"[01]", b"[1.]", b"[.5]", b"[-]", b"[1e400]", b"[1,]", b"[ 1 ] x", b"[]", b"[[1]]",
                 b"[NaN]", b"[Infinity]", b'["1"]', b"[0x10]", b"[1" + b"0" * 30 + b"]", b"[\x0b1]",
                 b"[64042265044328208]"]:  # an integer past 2^53 for a float input: NumPy rounds it its way
        assert not _parse([text], (1,), False)[0], text
    for text in [b"[1.5]", b"[1e2]", b"[1E2]", b"[1234567890123456789]"]:
        assert not _parse([text], (1,), True)[0], text
    assert _parse([b"[-123456789012345678]"], (1,), True)[1][0] == -123456789012345678


def test_parse_reports_the_batch_end_after_a_bad_line():
    data = bytearray(b"[1,2]\nbad\n[3,4]\n[5,6]\n")
    values, spans = np.zeros(8, np.int64), np.zeros(8, np.int64)
    assert _denselines.parse(data, 0, len(data), 3, (2,), True, values, spans) == (False, 3, 16)
    assert _denselines.parse(data, 16, len(data), 3, (2,), True, values, spans) == (True, 1, len(data))
    with pytest.raises(ValueError):
        _denselines.parse(data, 0, len(data), 5, (2,), True, values, spans)  # buffers too small
    # Integer lines cut short, ending at a newline and at the end of the data (two copies of the reader)
    for cut in [b"[1,2", b"[1,", b"[1", b"[", b"[-", b"[1,2 ", b"[1,2]]", b"[1,-]", b"[1,2]\r ,"]:
        for tail in (b"\n", b""):
            data = bytearray(b"[5,6]\n" + cut + tail)
            assert _denselines.parse(data, 0, len(data), 2, (2,), True, values, spans)[:2] == (False, 2), cut + tail
    data = bytearray(b"[5,6]\n [ 7 , -8 ]\t")
    assert _denselines.parse(data, 0, len(data), 2, (2,), True, values, spans) == (True, 2, len(data))
    assert values[:4].tolist() == [5, 6, 7, -8] and spans[2:4].tolist() == [7, 17]


@pytest.mark.parametrize("shape,dtype", [((5,), np.float32), ((5, 3), np.float32), ((5, 2, 2), np.float64),
                                         ((5, 4), np.int64), ((5, 1), np.uint8), ((0, 3), np.float32)])
def test_whole_batch_predictions_split_into_the_per_row_bytes(shape, dtype):
    rng = np.random.default_rng(1)
    value = (rng.normal(size=shape) * 1e3).astype(dtype)
    if value.dtype.kind == "f" and value.size:
        value.flat[:3] = [np.nan, np.inf, -0.0]
    n = shape[0]
    per_row = [orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) for row in value]
    data = bytearray(b"".join(b"[%d]\n" % i for i in range(n)))
    spans = np.array([[i * 4, i * 4 + 3] if i < 10 else [0, 0] for i in range(n)], np.int64).reshape(-1)
    whole = _denselines.assemble(data, spans, n, orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))
    assert whole == _denselines.assemble(data, spans, n, per_row)
    assert whole == b"".join(work.result_line(bytes(data[s:e]), None, p) + b"\n"
                             for (s, e), p in zip(spans.reshape(-1, 2), per_row))
    with pytest.raises(ValueError):
        _denselines.assemble(data, spans, n + 1 if n else 1, orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))


def test_parse_counts_lines_as_split_lines_does():
    values, spans = np.zeros(64, np.int64), np.zeros(64, np.int64)
    for raw in [b"", b"\n", b"[1]", b"[1]\n", b"[1]\n\n[2]", b"\n\n", b"x\ny\nz"]:
        data = bytearray(raw)
        _ok, n, after = _denselines.parse(data, 0, len(data), 32, (1,), True, values, spans)
        assert (n, after) == (len(split_lines(raw)), len(raw)), raw


def test_a_chunk_that_dies_half_way_leaves_no_part_and_redoes_exactly_once(tiny_model, tmp_path, monkeypatch):
    """Streamed results commit only by the final rename: a failure mid-chunk leaves nothing that
    counts, a temporary left by a killed worker is ignored and cleared, the redo commits once."""
    from modelyard.batch.shards import committed, finalize, result_shards

    predictor = _predictor(tiny_model.base)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r.tolist()) + "\n" for r in rows(20, seed=4)))
    chunks, _ = plan([str(src)], "jsonl", 10)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    run, calls = predictor.servable.run, []

    def dies_on_the_second_batch(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("worker died")
        return run(*args)

    with monkeypatch.context() as m:
        m.setattr(predictor.servable, "run", dies_on_the_second_batch)
        with pytest.raises(RuntimeError):
            work.process_chunk(job_dir, chunks[0], "jsonl", None, Shaping(), predictor, 4)
    assert committed(job_dir) == {} and list((job_dir / PARTS_DIR).iterdir()) == []
    (job_dir / PARTS_DIR / ".c000000.results.tmp-999999").write_bytes(b'{"instance":[1],"prediction"')  # kill -9
    for chunk in chunks:
        assert work.process_chunk(job_dir, chunk, "jsonl", None, Shaping(), predictor, 4) == (10, 0)
    assert sorted(committed(job_dir)) == [0, 1]
    assert finalize(job_dir, 2) == {"successful_count": 20, "failed_count": 0}
    lines = [line for shard in result_shards(job_dir) for line in shard.read_bytes().splitlines()]
    assert len(lines) == 20 and all(orjson.loads(line)["prediction"] for line in lines)
    assert not (job_dir / PARTS_DIR).exists()


def test_parse_on_mutated_lines_never_misreads():
    """Random byte edits of good lines: the C reader either refuses the batch or reads exactly
    what NumPy's text parser (the Python path) reads, and stays inside its buffers."""
    from modelyard.batch.fastjson import DenseParser

    rng = np.random.default_rng(9)
    alphabet = np.frombuffer(b"0123456789-+.eE,[] \t\r\n\x00x\"", np.uint8)
    for integer, dtype in ((True, np.int64), (False, np.float64)):
        parser = DenseParser("x", np.dtype(dtype), (2, 3))
        values, spans = np.zeros(3 * 6, np.int64), np.zeros(6, np.int64)
        accepted = 0
        for _ in range(3000):
            lines = [json.dumps(rng.integers(-300, 300, size=(2, 3)).tolist() if integer
                                else (rng.normal(size=(2, 3)) * 100).round(3).tolist()).encode() for _ in range(3)]
            data = bytearray(b"\n".join(lines))
            for _ in range(rng.integers(1, 3)):
                where = rng.integers(0, len(data))
                if rng.random() < 0.5:
                    data[where] = int(rng.choice(alphabet))
                else:
                    del data[where]
            ok, n, after = _denselines.parse(data, 0, len(data), 3, (2, 3), integer, values, spans)
            assert after == len(data) or n == 3
            if ok:
                accepted += 1
                got = split_lines(bytes(data[:after]))
                expected = parser.parse(got)
                assert expected is not None, bytes(data)
                read = values[:n * 6] if integer else values[:n * 6].view(np.float64)
                assert read.tobytes() == expected["x"].reshape(-1).tobytes(), bytes(data)
                assert [bytes(data[s:e]) for s, e in spans[:2 * n].reshape(-1, 2)] == [x.strip() for x in got]
        assert accepted > 100  # most single edits of a digit still give a good line


def test_threads_running_chunks_at_once_keep_their_own_buffers(tiny_model, tmp_path):
    import threading

    predictor = _predictor(tiny_model.base)
    sources = []
    for k in range(2):
        src = tmp_path / f"in{k}.jsonl"
        src.write_text("".join(json.dumps(r.tolist()) + "\n" for r in rows(400, seed=20 + k)))
        sources.append(src)
    alone = [_run(predictor, src, tmp_path / f"alone{k}", 8) for k, src in enumerate(sources)]
    together: dict[int, list] = {}
    threads = [threading.Thread(target=lambda k=k: together.__setitem__(k, _run(predictor, sources[k],
                                                                                   tmp_path / f"both{k}", 8)))
               for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [together[0], together[1]] == alone


def test_count_byte_agrees_with_python_at_every_length_and_alignment():
    rng = np.random.default_rng(11)
    data = bytes(rng.choice(np.frombuffer(b"\n[1,2]\n ", np.uint8), size=4096))
    for start in range(0, 70):
        for length in (0, 1, 63, 64, 65, 127, 128, 129, 1000, 4096 - start):
            piece = data[start:start + length]
            assert _denselines.count_byte(piece, 10) == piece.count(b"\n"), (start, length)
    assert _denselines.count_byte(memoryview(bytearray(b"a\nb\n")), ord("b")) == 1


def test_line_ranges_are_the_same_counted_in_c_or_numpy(tmp_path: Path, monkeypatch):
    from modelyard.batch.readers import lines, source

    rng = np.random.default_rng(5)
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"".join(b"x" * int(n) + b"\n" for n in rng.integers(0, 300, size=5000)) + b"tail")
    monkeypatch.setattr(source, "BLOCK", 4096)  # many blocks, chunks ending inside and across them
    with_c = [list(lines.line_ranges(str(path), rows)) for rows in (1, 7, 64, 1000, 10000)]
    monkeypatch.setattr(lines, "_count_byte", None)
    assert with_c == [list(lines.line_ranges(str(path), rows)) for rows in (1, 7, 64, 1000, 10000)]
    assert sum(r for _, _, r in with_c[2]) == 5001 and with_c[2][-1][1] == path.stat().st_size


def test_planning_a_large_file_holds_a_window_of_it_not_the_file(tmp_path: Path):
    """The planner maps the input to count its lines; the mapped pages it touched must not pile
    up in its RSS (a 2 GB input once showed as a 2 GB process)."""
    import subprocess
    import sys

    from tests.batch.conftest import SRC

    path = tmp_path / "big.jsonl"
    line = b"[" + b"1," * 511 + b"1]\n"  # 1 KiB
    with open(path, "wb") as f:
        for _ in range(384):
            f.write(line * 1024)  # 384 MiB in all
    probe = ("import resource, sys\n"
             "from modelyard.batch.readers.lines import line_ranges\n"
             "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "ranges = list(line_ranges(sys.argv[1], 50000))\n"
             "print(sum(r for _, _, r in ranges), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr
    rows, grown_mib = map(int, done.stdout.split())
    assert rows == 384 * 1024
    assert grown_mib < 128, f"planning grew the process by {grown_mib} MiB for a 384 MiB file"
