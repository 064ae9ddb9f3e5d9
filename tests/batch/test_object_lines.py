"""Object JSON lines (``{"id": 7, "x": [...]}`` with ``key_field``, or ``{"x": [...]}``) on the C path.

``_keyedlines.pluck`` takes each line apart for the dense readers; the job must write what the
general loop writes for the same file, byte for byte for results and line for line for
errors, and take the C path for the batches it qualifies.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from modelyard.batch import dense_chunk, work
from modelyard.batch.instances import Shaping
from modelyard.batch.predictor import Predictor, load_servable
from modelyard.batch.readers import plan
from modelyard.batch.shards import PARTS_DIR
from tests.batch.conftest import rows

_keyedlines = dense_chunk._keyedlines
if _keyedlines is None:
    pytest.fail("modelyard.batch._keyedlines is not built: run `python3 setup.py build_ext --inplace` "
                "(needs a C compiler)", pytrace=False)


class _Counting:
    """``_keyedlines`` with its batches counted: how many it took."""

    def __init__(self) -> None:
        self.taken = self.refused = 0

    def pluck(self, *args):
        found = _keyedlines.pluck(*args)
        if found[0]:
            self.taken += 1
        else:
            self.refused += 1
        return found


def _parts(predictor: Predictor, src: Path, job_dir: Path, shaping: Shaping) -> list[tuple[str, bytes]]:
    job_dir.mkdir()
    chunks, _ = plan([str(src)], "jsonl", 9)
    for chunk in chunks:
        work.process_chunk(job_dir, chunk, "jsonl", None, shaping, predictor, 4)
    return sorted((p.name, p.read_bytes()) for p in (job_dir / PARTS_DIR).iterdir())


def _both_ways(tiny_model, lines: list[str], shaping: Shaping, tmp_path: Path, monkeypatch):
    predictor = Predictor(load_servable(tiny_model.base / "0001"))
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    counting = _Counting()
    with monkeypatch.context() as m:
        m.setattr(dense_chunk, "_keyedlines", counting)
        fast = _parts(predictor, src, tmp_path / "c", shaping)
    with monkeypatch.context() as m:
        m.setattr(dense_chunk, "_keyedlines", None)
        general = _parts(predictor, src, tmp_path / "general", shaping)
    return fast, general, counting


def _split(parts) -> tuple[list[bytes], list[bytes]]:
    results = [b for name, b in parts if name.endswith(".results")]
    errors = sorted(line for name, b in parts if name.endswith(".errors") for line in b.splitlines())
    return results, errors


def _vector(values) -> str:
    return json.dumps([float(v) for v in values])


BAD_KEYED = [
    '{"id": 1001.5, "x": [1, 2, 3, 4]}',  # a float key: the general loop writes it back
    '{"id": -0, "x": [1, 2, 3, 4]}',  # reads back as key 0, as the general loop has it
    '{"id": "caf\\u00e9", "x": [1, 2, 3, 4]}',  # an escaped key
    '{"x": [1, 2, 3, 4]}',  # no key: an error line
    '{"id": 1005, "x": [1, 2, 3]}',  # the model refuses the shape: an error line
    '{"id": 1006, "x": [1, 2, 3, 4], "extra": 1}',  # another field: the model refuses it
    '{"id": 1007, "id": 1008, "x": [1, 2, 3, 4]}',  # a duplicate: the last one counts
    '[1, 2, 3, 4]',  # not an object: key_field needs objects
    '{"id": 1009, "x": [1, 2, "3", 4]}',
    'not json',
]


def test_keyed_object_lines_give_the_general_loops_bytes(tiny_model, tmp_path, monkeypatch):
    x = rows(60, seed=31)
    good = [f'{{"id": {i}, "x": {_vector(v)}}}' for i, v in enumerate(x[:40])]
    good += [f'{{ "x" : {_vector(v)} , "id" : "row-{i}" }}  ' for i, v in enumerate(x[40:])]  # other order, blanks
    lines = good[:12] + BAD_KEYED[:5] + good[12:36] + BAD_KEYED[5:] + good[36:]
    fast, general, counting = _both_ways(tiny_model, lines, Shaping(key_field="id"), tmp_path, monkeypatch)
    assert _split(fast) == _split(general)
    assert counting.taken >= 8 and counting.refused >= 4  # most batches on the C path, the bad ones not
    results = [json.loads(line) for _name, b in fast if _name.endswith(".results") for line in b.splitlines()]
    by_key = {r["key"]: r["prediction"] for r in results if r["key"] != 0}  # -0 is key 0 as well
    assert set(range(1, 40)) | {f"row-{i}" for i in range(20)} <= set(by_key)
    np.testing.assert_allclose([by_key[i] for i in range(1, 40)], tiny_model.reference(x[1:40]), atol=1e-5)
    errors = b"\n".join(_split(fast)[1])
    assert b"instance has no key field 'id'" in errors and b"need object instances, got an array" in errors


def test_object_lines_without_a_key_give_the_general_loops_bytes(tiny_model, tmp_path, monkeypatch):
    x = rows(40, seed=32)
    good = [f'{{"x": {_vector(v)}}}' for v in x]
    bad = ['{"x": [1, 2, 3]}', '{"y": [1, 2, 3, 4]}', '{"x": [1, 2, 3, 4], "z": 1}', "{}", "{"]
    lines = good[:10] + bad + good[10:]
    fast, general, counting = _both_ways(tiny_model, lines, Shaping(), tmp_path, monkeypatch)
    assert _split(fast) == _split(general)
    assert counting.taken >= 6 and counting.refused >= 2
    first = json.loads(next(b for name, b in fast if name.endswith(".results")).splitlines()[0])
    assert first["instance"] == {"x": [float(v) for v in x[0]]}  # the line itself, echoed


def test_pluck_takes_apart_exactly_the_lines_it_can_echo():
    data = (b'{"id": 7, "image": [[1,2],[3,4]]}\n'
            b'{"image":[[5,6],[7,8]],"id":"a-b"}\n'
            b'  {"id":-12 , "image" : [[0,0],[0,1]]}  \r\n')
    out, spans = bytearray(len(data) + 1), np.zeros(8, np.int64)
    ok, n, after, used = _keyedlines.pluck(data, 0, len(data), 4, b"id", b"image", out, spans)
    assert (ok, n, after) == (True, 3, len(data))
    assert bytes(out[:used]) == b"[[1,2],[3,4]]\n[[5,6],[7,8]]\n[[0,0],[0,1]]\n"
    assert [data[spans[2 * i]:spans[2 * i + 1]] for i in range(3)] == [b"7", b'"a-b"', b"-12"]

    refused = [b'{"id": 1001.5, "image": [[1]]}', b'{"id": -0, "image": [[1]]}', b'{"id": 01, "image": [[1]]}',
               b'{"id": 1, "image": [[1]], "x": 2}', b'{"image": [[1]]}', b'{"id": 1, "id": 2, "image": [[1]]}',
               b'{"id": "\\u00e9", "image": [[1]]}', b'{"id": "\xc3\xa9", "image": [[1]]}',
               b'{"id": 1, "image": [[true]]}', b'{"id": 1, "image": [[1]]', b'{"id": 1, "image": [[1]]} x',
               b'{"i\\d": 1, "image": [[1]]}', b'[[1]]', b'',
               b'{"id": 1234567890123456789, "image": [[1]]}',
               b'{"id": 1, "image": [[-0, 1]]}']  # the int -0 is +0.0 to the general loop
    for line in refused:
        ok, n, after, _used = _keyedlines.pluck(line + b"\n", 0, len(line) + 1, 4, b"id", b"image",
                                                bytearray(100), spans)
        assert (ok, n, after) == (False, 1, len(line) + 1), line

    for taken in (b'{"id": 1, "image": [[-0.0, -0e1, -1, 0]]}', b'{"id": 1, "image": [[-10, -0.5]]}'):
        assert _keyedlines.pluck(taken, 0, len(taken), 1, b"id", b"image", bytearray(100), spans)[0], taken

    # Out of room: the size that holds the batch, to grow the buffer and call again.
    ok, n, after, used = _keyedlines.pluck(data, 0, len(data), 4, b"id", b"image", bytearray(20), spans)
    assert (ok, n, after, used) == (False, 3, len(data), -(len(data) + 1))
    assert _keyedlines.pluck(data, 0, len(data), 4, b"id", b"image", bytearray(-used), spans)[0]

    # Without a key, the echo is the stripped line; a batch stops at n lines.
    data = b' {"image": [1]} \n{"image": [2]}\n{"image": [3]}\n'
    ok, n, after, used = _keyedlines.pluck(data, 0, len(data), 2, None, b"image", bytearray(100), spans)
    assert (ok, n, after) == (True, 2, data.index(b"{\"image\": [3]"))
    assert data[spans[0]:spans[1]] == b'{"image": [1]}'
