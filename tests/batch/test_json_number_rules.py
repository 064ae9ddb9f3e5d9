"""Batch prediction follows serving's one rule for JSON numbers (``model.dtypes``), on every reader.

``modelyard batch-predict``: a uint8 pixel of 300 is an error line with the message ``modelyard
serve`` answers (not wrapped to 44 and predicted), 255 passes, the other rows are predicted. With
``--json-numbers vertex`` (the platform's jobs), ``0.0`` and ``1e2`` are integers and ``0.5`` an
error line. The C reader (``_denselines``) under that rule reads what the general path reads.
"""
from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import numpy as np
import orjson
import pytest

from modelyard.batch import dense_chunk
from modelyard.batch.instances import to_arrays
from modelyard.batch.predictor import Predictor, load_servable
from modelyard.errors import ServingError
from modelyard.model import dtypes
from tests.batch.conftest import cli_command, cli_env, read_lines, write_jsonl
from tests.batch.test_fast_paths import _same_rows, _three_ways

_denselines = dense_chunk._denselines
if _denselines is None:
    pytest.fail("modelyard.batch._denselines is not built: run `python3 setup.py build_ext --inplace` "
                "(needs a C compiler)", pytrace=False)


@pytest.fixture(scope="module")
def sum_model(tmp_path_factory) -> Path:
    """uint8 pixels [2, 3] -> their sum (float): every pixel's value shows in the prediction."""
    import tensorflow as tf

    class Sum(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2, 3], tf.uint8, name="pixels")])
        def serve(self, pixels):
            return {"total": tf.reduce_sum(tf.cast(pixels, tf.float32), axis=[1, 2])}

    base = tmp_path_factory.mktemp("models") / "sum"
    module = Sum()
    tf.saved_model.save(module, str(base / "1"), signatures={"serving_default": module.serve})
    return base


def _job(tmp_path: Path, model: Path, lines: list[str], *flags: str) -> tuple[list[dict], list[dict]]:
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    done = subprocess.run(cli_command("--model", str(model), "--input", str(src), "--output", str(tmp_path / "out"),
                                      "--workers", "0", "--no-progress", *flags),
                          env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (job_dir,) = (tmp_path / "out").iterdir()
    results = [r for f in sorted(job_dir.glob("prediction.results-*")) for r in read_lines(f)]
    return results, read_lines(job_dir / "prediction.errors_stats-00000-of-00001")


LINES = ["[[255,255,255],[0,0,1]]", "[[300,0,0],[0,0,0]]", "[[1,2,3],[4,5,6]]", "[[0.0,3.0,1e2],[0,0,0]]",
         "[[0.5,0,0],[0,0,0]]", "[[-1,0,0],[0,0,0]]"]


def test_an_out_of_range_pixel_is_an_error_line_with_the_serving_message(sum_model, tmp_path):
    results, errors = _job(tmp_path, sum_model, LINES)
    assert {json.dumps(r["instance"]): r["prediction"] for r in results} == {
        "[[255, 255, 255], [0, 0, 1]]": 766.0, "[[1, 2, 3], [4, 5, 6]]": 21.0}
    by_row = {json.dumps(e["instance"]): e["error"] for e in errors}
    message = dtypes.range_message(dtypes.DT_UINT8, "pixels")  # serve's words (tests/serving/test_json_number_rules.py)
    assert message.startswith("JSON Value out of range for uint8 in input pixels")
    assert by_row["[[300, 0, 0], [0, 0, 0]]"] == {"status": "INVALID_ARGUMENT", "message": message}
    assert by_row["[[-1, 0, 0], [0, 0, 0]]"] == {"status": "INVALID_ARGUMENT", "message": message}
    # TF Serving's rule (the default): whole-valued doubles are not integers either
    assert "0.0 not of type uint8" in by_row["[[0.0, 3.0, 100.0], [0, 0, 0]]"]["message"]
    assert "0.5 not of type uint8" in by_row["[[0.5, 0, 0], [0, 0, 0]]"]["message"]


def test_the_vertex_rule_takes_integral_doubles(sum_model, tmp_path):
    results, errors = _job(tmp_path, sum_model, LINES, "--json-numbers", "vertex")
    assert {json.dumps(r["instance"]): r["prediction"] for r in results} == {
        "[[255, 255, 255], [0, 0, 1]]": 766.0, "[[1, 2, 3], [4, 5, 6]]": 21.0, "[[0.0, 3.0, 100.0], [0, 0, 0]]": 103.0}
    messages = sorted(e["error"]["message"] for e in errors)
    assert len(messages) == 3 and "0.5 not of type uint8" in messages[2]
    assert messages[:2] == [dtypes.range_message(dtypes.DT_UINT8, "pixels")] * 2


def _numbers(rng: random.Random) -> str:
    """A pixel as clients write it: an integer, or a double (whole-valued or not), in range or not."""
    roll = rng.random()
    v = rng.randint(0, 255) if roll < 0.85 else rng.randint(-300, 600) if roll < 0.95 else rng.randint(0, 255) + 0.5
    style = rng.randrange(5)
    if style == 0 or isinstance(v, float):
        return repr(float(v)) if rng.random() < 0.8 else f"{float(v):.3e}"
    if style == 1:
        return f"{v}.0"
    if style == 2:
        return f"{v}.000" if v else "-0.0"
    if style == 3 and v and v % 10 == 0:
        return f"{v // 10}e1"
    return str(v)


def test_the_c_reader_under_the_vertex_rule_reads_what_the_general_path_reads(sum_model):
    predictor = Predictor(load_servable(sum_model / "1"), json_numbers="vertex")
    dense = predictor.dense
    rng = random.Random(5)
    lines = ["[[" + ",".join(_numbers(rng) for _ in range(3)) + "],[" + ",".join(_numbers(rng) for _ in range(3))
             + "]]" for _ in range(400)]
    taken = refused = 0
    values, spans = np.empty(6, np.int64), np.empty(2, np.int64)
    for line in lines:
        data = line.encode()
        ok, n, _ = _denselines.parse(data, 0, len(data), 1, dense.shape, True, values, spans, True)
        try:
            general = to_arrays([orjson.loads(data)], predictor.signature, True)["pixels"]
        except ServingError:
            general = None
        if not ok:  # left to the Python path (what the general path refuses, and what C does not read)
            refused += 1
            continue
        taken += 1
        fitted = dense.fit(values.copy())  # the range rule applied after C, as dense_chunk does
        if general is None:
            assert fitted is None, line  # C read it, the range rule refuses it: the general path's row error
        else:
            assert fitted is not None and fitted.tobytes() == general.tobytes(), line
        # the C reader without the rule takes no double at all
        strict_ok, _, _ = _denselines.parse(data, 0, len(data), 1, dense.shape, True, values, spans)
        assert not strict_ok or ("." not in line and "e" not in line), line
    assert taken > 100 and refused > 30


def test_every_path_of_a_chunk_writes_the_same_rows_under_the_vertex_rule(sum_model, tmp_path, monkeypatch):
    predictor = Predictor(load_servable(sum_model / "1"), json_numbers="vertex")
    rng = random.Random(9)
    lines = ["[[" + ",".join(_numbers(rng) for _ in range(3)) + "],[" + ",".join(_numbers(rng) for _ in range(3))
             + "]]" for _ in range(60)]
    fast, numpy_path, general = _three_ways(predictor, lines, tmp_path, monkeypatch, batch_size=4)
    assert fast == numpy_path
    _same_rows(fast, general)
    ok = sum(b.count(b"\n") for name, b in fast if name.endswith(".results"))
    assert 0 < ok < len(lines)  # both kinds of rows were there
