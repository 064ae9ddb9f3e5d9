"""JSONL and CSV inputs through ``modelyard.batch_predict``: predictions, keys, shard layout, stats, bad rows."""
from __future__ import annotations

import re

import numpy as np

import modelyard
from tests.batch.conftest import read_lines, rows, write_jsonl

SHARD = re.compile(r"^prediction\.results-(\d{5})-of-(\d{5})$")
JOB_DIR = re.compile(r"^prediction-tiny-\d{4}_\d\d_\d\dT\d\d_\d\d_\d\d_\d{3}Z$")


def _shards(job_dir):
    names = sorted(p.name for p in job_dir.iterdir() if p.name.startswith("prediction.results"))
    matches = [SHARD.match(n) for n in names]
    assert all(matches), names
    n = {int(m.group(2)) for m in matches}
    assert n == {len(names)}, names
    assert [int(m.group(1)) for m in matches] == list(range(len(names)))
    return names


def test_jsonl_objects_with_key_field(tiny_model, tmp_path):
    x = rows(2500)
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "x": v.tolist()} for i, v in enumerate(x)])
    job = modelyard.batch_predict(str(tiny_model.base), str(src), tmp_path / "out", key_field="id",
                                  chunk_rows=1000, workers=0)
    assert job.state == "JOB_STATE_SUCCEEDED", job.error
    assert JOB_DIR.match(job.job_dir.name), job.job_dir.name
    assert job.output_info.gcs_output_directory == str(job.job_dir)
    assert len(_shards(job.job_dir)) == 3
    assert job.completion_stats == {"successful_count": 2500, "failed_count": 0, "incomplete_count": 0}
    assert (job.job_dir / "prediction.errors_stats-00000-of-00001").read_text() == ""
    out = {o["key"]: o["prediction"] for o in job.iter_outputs()}
    assert set(out) == {f"r{i}" for i in range(2500)}
    got = np.array([out[f"r{i}"] for i in range(2500)], np.float32)
    np.testing.assert_allclose(got, tiny_model.reference(x), atol=1e-5)
    first = next(job.iter_outputs())
    assert set(first) == {"key", "prediction"}


def test_jsonl_arrays_echo_the_instance(tiny_model, tmp_path):
    x = rows(10, seed=1)
    src = write_jsonl(tmp_path / "in.jsonl", [v.tolist() for v in x])
    job = modelyard.batch_predict(str(tiny_model.base) + ":1", str(src), tmp_path / "out", workers=0)
    assert job.state == "JOB_STATE_SUCCEEDED", job.error
    assert _shards(job.job_dir) == ["prediction.results-00000-of-00001"]
    out = list(job.iter_outputs())
    assert [o["instance"] for o in out] == [v.tolist() for v in x]
    np.testing.assert_allclose([o["prediction"] for o in out], tiny_model.reference(x), atol=1e-5)


def test_csv_rows_are_arrays_in_header_order(tiny_model, tmp_path):
    x = rows(300, seed=2)
    lines = ["id,a,b,c,d"] + [f"{i}," + ",".join(repr(float(v)) for v in r) for i, r in enumerate(x)]
    src = tmp_path / "in.csv"
    src.write_text("\n".join(lines) + "\n")
    job = modelyard.batch_predict(str(tiny_model.base), str(src), tmp_path / "out", format="csv",
                                  key_field="id", chunk_rows=128, workers=0)
    assert job.state == "JOB_STATE_SUCCEEDED", job.error
    assert len(_shards(job.job_dir)) == 3
    out = {o["key"]: o["prediction"] for o in job.iter_outputs()}
    assert sorted(out) == list(range(300))
    np.testing.assert_allclose([out[i] for i in range(300)], tiny_model.reference(x), atol=1e-5)


def test_csv_object_instances_and_included_fields(tiny_model, tmp_path):
    # included_fields + array picks and orders the columns the model sees.
    x = rows(20, seed=3)
    lines = ["d,c,noise,b,a"] + [f"{r[3]},{r[2]},junk,{r[1]},{r[0]}" for r in x]
    src = tmp_path / "in.csv"
    src.write_text("\n".join(lines) + "\n")
    job = modelyard.batch_predict(str(tiny_model.base), str(src), tmp_path / "out", format="csv",
                                  included_fields="a,b,c,d", instance_type="array", workers=0)
    assert job.state == "JOB_STATE_SUCCEEDED", job.error
    out = list(job.iter_outputs())
    np.testing.assert_allclose([o["instance"] for o in out], x, atol=1e-6)
    np.testing.assert_allclose([o["prediction"] for o in out], tiny_model.reference(x), atol=1e-5)
    excluded = modelyard.batch_predict(str(tiny_model.base), str(src), tmp_path / "out2", format="csv",
                                       excluded_fields=["noise"], instance_type="object", workers=0)
    # Objects name inputs; {d,c,b,a} is not the model's {x}: every row an error line, none dropped,
    # and a job in which no row succeeded fails.
    assert excluded.state == "JOB_STATE_FAILED" and excluded.error.startswith("no row succeeded"), excluded.error
    assert excluded.completion_stats["failed_count"] == 20
    errors = read_lines(excluded.job_dir / "prediction.errors_stats-00000-of-00001")
    assert errors[0]["instance"].keys() == {"a", "b", "c", "d"}
    assert "do not match the model's inputs {x}" in errors[0]["error"]["message"]


def test_three_bad_rows_among_10000(tiny_model, tmp_path):
    x = rows(10_000, seed=4)
    lines = [{"id": i, "x": v.tolist()} for i, v in enumerate(x)]
    lines[17] = {"id": 17, "x": [1.0, 2.0, 3.0]}  # wrong length
    lines[5000] = {"id": 5000, "x": ["a", "b", "c", "d"]}  # strings for a float input
    lines[9999] = {"id": 9999, "x": [[1.0, 2.0], [3.0]]}  # ragged
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = modelyard.batch_predict(str(tiny_model.base), str(src), tmp_path / "out", key_field="id",
                                  batch_size=64, workers=0)
    assert job.state == "JOB_STATE_SUCCEEDED", job.error
    assert job.completion_stats == {"successful_count": 9997, "failed_count": 3, "incomplete_count": 0}
    results = list(job.iter_outputs())
    assert len(results) == 9997
    assert {o["key"] for o in results} == set(range(10_000)) - {17, 5000, 9999}
    errors = read_lines(job.job_dir / "prediction.errors_stats-00000-of-00001")
    assert sorted(e["key"] for e in errors) == [17, 5000, 9999]
    assert {e["error"]["status"] for e in errors} == {"INVALID_ARGUMENT"}
    by_key = {e["key"]: e for e in errors}
    assert by_key[17]["instance"] == {"x": [1.0, 2.0, 3.0]}
    assert "has shape [1, 3]; the model expects [-1, 4]" in by_key[17]["error"]["message"]
    assert "not of type float" in by_key[5000]["error"]["message"]
    # Rows batched with a bad row still got the model's own answer.
    good = {o["key"]: o["prediction"] for o in results}
    np.testing.assert_allclose([good[16], good[18], good[4999]], tiny_model.reference(x[[16, 18, 4999]]), atol=1e-5)


def test_fast_path_batches_with_bad_rows_fall_back_row_by_row(tiny_model, tmp_path):
    """Unkeyed array lines take the bytes fast path; a batch holding a bad row is redone row by row."""
    import json

    x = rows(1000, seed=10)
    lines = [json.dumps(v.tolist()) for v in x]
    bad = {10: "[1,,3,4]", 200: "[[1,2],[3,4]]", 201: "[1,2,3,4,5]", 640: '[1,2,3,"4"]', 999: "[1e400,2,3,4"}
    for i, text in bad.items():
        lines[i] = text
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = modelyard.batch_predict(str(tiny_model.base), str(src), tmp_path / "out", batch_size=50, workers=0)
    assert job.state == "JOB_STATE_SUCCEEDED", job.error
    assert job.completion_stats["successful_count"] == 995
    out = list(job.iter_outputs())
    good = [i for i in range(1000) if i not in bad]
    np.testing.assert_allclose([o["instance"] for o in out], x[good], atol=1e-6)
    np.testing.assert_allclose([o["prediction"] for o in out], tiny_model.reference(x[good]), atol=1e-5)
    errors = read_lines(job.job_dir / "prediction.errors_stats-00000-of-00001")
    assert len(errors) == 5 and {e["error"]["status"] for e in errors} == {"INVALID_ARGUMENT"}
    assert errors[0]["error"]["message"].startswith(f"{src} line 11: not valid JSON")
    assert errors[1]["instance"] == [[1, 2], [3, 4]]
    assert errors[2]["error"]["message"] == "input 'x' has shape [1, 5]; the model expects [-1, 4] (-1: any size)"
