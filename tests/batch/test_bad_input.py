"""Bad input to ``modelyard batch-predict``: each a clear error (exit 2, nothing written) or an error line."""
from __future__ import annotations

import json

import pytest

from modelyard.cli import main
from tests.batch.conftest import read_lines, rows, write_jsonl


def _run(capsys, *args) -> tuple[int, str, str]:
    code = main(["batch-predict", "--no-progress", "--workers", "0", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def good_input(tmp_path):
    return write_jsonl(tmp_path / "good.jsonl", [v.tolist() for v in rows(5)])


def test_missing_input_file(tiny_model, tmp_path, capsys):
    code, _, err = _run(capsys, "--model", str(tiny_model.base), "--input", str(tmp_path / "nope.jsonl"),
                        "--output", str(tmp_path / "out"))
    assert code == 2
    assert f"--input {tmp_path / 'nope.jsonl'}: no such file" in err
    assert not (tmp_path / "out").exists()


def test_empty_glob(tiny_model, tmp_path, capsys):
    code, _, err = _run(capsys, "--model", str(tiny_model.base), "--input", str(tmp_path / "*.jsonl"),
                        "--output", str(tmp_path / "out"))
    assert code == 2
    assert "the pattern matched no files" in err
    assert not (tmp_path / "out").exists()


def test_model_path_that_is_not_a_model(tmp_path, good_input, capsys):
    not_model = tmp_path / "notamodel"
    (not_model / "stuff").mkdir(parents=True)
    code, _, err = _run(capsys, "--model", str(not_model), "--input", str(good_input), "--output", str(tmp_path / "o"))
    assert code == 2
    assert f"{not_model} is not a model: expected saved_model.pb" in err
    code, _, err = _run(capsys, "--model", str(tmp_path / "absent"), "--input", str(good_input), "--output", "o")
    assert code == 2 and "does not exist" in err


def test_missing_version(tiny_model, good_input, tmp_path, capsys):
    code, _, err = _run(capsys, "--model", f"{tiny_model.base}:7", "--input", str(good_input),
                        "--output", str(tmp_path / "o"))
    assert code == 2
    assert "has no version 7 (versions: 1)" in err


def test_resume_of_a_directory_that_is_not_a_job(tmp_path, capsys):
    code, _, err = _run(capsys, "--resume", str(tmp_path))
    assert code == 2
    assert "is not a batch prediction job (no job.json)" in err


def test_unreadable_lines_become_error_lines(tiny_model, tmp_path, capsys):
    src = tmp_path / "mixed.jsonl"
    good = [json.dumps(v.tolist()) for v in rows(4)]
    src.write_bytes("\n".join([good[0], "{not json", good[1], "", good[2]]).encode() + b"\n\xff\xfe[1]\n"
                    + good[3].encode())  # last line has no newline
    code, stdout, err = _run(capsys, "--model", str(tiny_model.base), "--input", str(src),
                             "--output", str(tmp_path / "out"))
    assert code == 0, err
    assert "4 results, 3 errors, 7 rows" in stdout
    (job_dir,) = (tmp_path / "out").iterdir()
    errors = read_lines(job_dir / "prediction.errors_stats-00000-of-00001")
    assert [e["error"]["status"] for e in errors] == ["INVALID_ARGUMENT"] * 3
    messages = [e["error"]["message"] for e in errors]
    assert messages[0].startswith(f"{src} line 2: not valid JSON")
    assert messages[1] == f"{src} line 4: empty line"
    assert messages[2].startswith(f"{src} line 6: not valid JSON")
    assert errors[0]["instance"] == "{not json"


def test_bad_options(tiny_model, good_input, tmp_path, capsys):
    base = ["--model", str(tiny_model.base), "--input", str(good_input), "--output", str(tmp_path / "o")]
    code, _, err = _run(capsys, *base, "--batch-size", "0")
    assert code == 2 and "--batch-size 0: must be at least 1" in err
    code, _, err = _run(capsys, *base, "--included-fields", "a", "--excluded-fields", "b")
    assert code == 2 and "cannot both be given" in err
    code, _, err = _run(capsys, *base, "--engine", "ray")  # _run passes --workers 0
    assert code == 2 and "--workers 0: the ray engine runs 1 or more actors" in err


def test_a_row_of_the_wrong_shape_gets_the_shape_rule_not_tensorflows_internals(tiny_model, tmp_path, capsys):
    src = write_jsonl(tmp_path / "rows.jsonl", [rows(1)[0].tolist(), [1.0, 2.0, 3.0]])
    code, stdout, err = _run(capsys, "--model", str(tiny_model.base), "--input", str(src),
                             "--output", str(tmp_path / "out"))
    assert code == 0, err
    (job_dir,) = (tmp_path / "out").iterdir()
    (error,) = read_lines(job_dir / "prediction.errors_stats-00000-of-00001")
    assert error["error"] == {"status": "INVALID_ARGUMENT",
                              "message": "input 'x' has shape [1, 3]; the model expects [-1, 4] (-1: any size)"}
