"""`modelyard batch-predict` as a new user meets it (issue 27, points 5 and 6): one --output holds any
number of jobs, each in its own folder; --resume of another job says what differs (and offers no
--resume for a finished one); the format comes from the extension when --format is absent; a job in
which no row succeeded fails."""
from __future__ import annotations

import json
import os

from modelyard.cli import main
from tests.batch.conftest import read_lines, rows, write_jsonl


def _run(capsys, *args) -> tuple[int, str, str]:
    code = main(["batch-predict", "--no-progress", "--workers", "0", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _jobs(out) -> list:
    return sorted(p for p in out.iterdir() if p.name.startswith("prediction-"))


def test_one_output_holds_any_number_of_jobs(tiny_model, tmp_path, capsys):
    out = tmp_path / "out"
    first = write_jsonl(tmp_path / "first.jsonl", [v.tolist() for v in rows(5)])
    second = write_jsonl(tmp_path / "second.jsonl", [v.tolist() for v in rows(3, seed=1)])
    model = ["--model", str(tiny_model.base), "--output", str(out)]
    code, stdout, err = _run(capsys, *model, "--input", str(first))
    assert code == 0 and "5 results, 0 errors" in stdout, err
    code, stdout, err = _run(capsys, *model, "--input", str(second))
    assert code == 0 and "3 results, 0 errors" in stdout, err
    jobs = _jobs(out)
    assert len(jobs) == 2  # each its own prediction-<model>-<time>/ folder
    assert sorted(len(read_lines(j / "prediction.results-00000-of-00001")) for j in jobs) == [3, 5]
    # The same command again finds its own job, finished: nothing is done.
    code, _, err = _run(capsys, *model, "--input", str(first))
    assert code == 0 and "already finished (SUCCEEDED: 5 results, 0 errors); nothing to do" in err, err
    assert len(_jobs(out)) == 2

    # --resume of one job with the other's arguments: what differs, and no --resume offered for a finished job.
    first_job = next(j for j in jobs if json.loads((j / "job.json").read_text())["spec"]["inputs"][0][0] == str(first))
    code, _, err = _run(capsys, "--resume", str(first_job), "--model", str(tiny_model.base), "--input", str(second))
    assert code == 2, err
    assert f"input {first} is the job's, not this run's" in err and f"input {second} is this run's, not the job's" in err
    assert "that job is finished: drop --resume to run these arguments as a new job beside it" in err
    assert "finish that job" not in err


def test_an_edited_input_starts_a_new_job_and_names_the_unfinished_one(tiny_model, tmp_path, capsys):
    """A job cut short, then its input edited: the new run says what changed and how to finish the old one."""
    from modelyard.batch import job as jobs
    from modelyard.batch.api import build_spec

    src = write_jsonl(tmp_path / "in.jsonl", [v.tolist() for v in rows(4)])
    out = tmp_path / "out"
    old = jobs.create_job(out, build_spec(str(tiny_model.base), str(src)))  # an unfinished job (never ran)
    write_jsonl(src, [v.tolist() for v in rows(6)])
    os.utime(src, ns=(old.spec.inputs[0].mtime_ns + 10**9,) * 2)
    code, stdout, err = _run(capsys, "--model", str(tiny_model.base), "--input", str(src), "--output", str(out))
    assert code == 0 and "6 results" in stdout, err
    assert f"note: --output also holds {old.job_dir.name}, an unfinished job" in err, err
    assert f"input {src} changed since the job started (" in err and " bytes, modified " in err, err
    assert f"--resume {old.job_dir} finishes that one" in err
    code, _, err = _run(capsys, "--resume", str(old.job_dir), "--model", str(tiny_model.base), "--input", str(src))
    assert code == 2 and f"input {src} changed since the job started" in err, err
    assert "drop --model/--input (and the other options) to finish that job as it was started" in err


def test_the_format_comes_from_the_extension(tiny_model, tmp_path, capsys):
    x = rows(4, seed=3)
    src = tmp_path / "rows.csv"
    src.write_text("a,b,c,d\n" + "".join(",".join(repr(float(v)) for v in r) + "\n" for r in x))
    code, stdout, err = _run(capsys, "--model", str(tiny_model.base), "--input", str(src), "--output",
                             str(tmp_path / "out"))
    assert code == 0 and "JOB_STATE_SUCCEEDED: 4 results, 0 errors" in stdout, err
    assert "reading the input as csv (from its extension; --format sets it)" in err

    from modelyard.batch.spec import BatchError, InputFile, guess_format

    def guess(*names):
        return guess_format(tuple(InputFile(n, 1, 1) for n in names))

    assert guess("a.jsonl", "b.JSON") == "jsonl" and guess("x.tfrecord") == "tf-record"
    assert guess("gs://b/data/part-0.csv") == "csv" and guess("instances.txt") == "jsonl"
    try:
        guess("a.csv", "b.jsonl")
    except BatchError as exc:
        assert "different formats" in str(exc) and "give --format" in str(exc)
    else:
        raise AssertionError("mixed formats were accepted")


def test_a_job_in_which_no_row_succeeded_fails(tiny_model, tmp_path, capsys):
    src = tmp_path / "rows.csv"
    src.write_text("a,b,c,d\n1,2,3,4\n5,6,7,8\n")
    out = tmp_path / "out"
    command = ["--model", str(tiny_model.base), "--input", str(src), "--output", str(out), "--format", "jsonl"]
    code, stdout, err = _run(capsys, *command)
    assert code == 1, (stdout, err)
    assert "JOB_STATE_FAILED: no row succeeded: all 3 rows failed (the first: " in err, err
    assert "The input was read as jsonl (--format)" in err
    (job_dir,) = _jobs(out)
    data = json.loads((job_dir / "job.json").read_text())
    assert data["state"] == "JOB_STATE_FAILED"
    assert (data["completion_stats"]["successful_count"], data["completion_stats"]["failed_count"]) == (0, 3)
    assert len(read_lines(job_dir / "prediction.errors_stats-00000-of-00001")) == 3
    # Every row was tried: the same command reports the job, does not run it again, and still fails.
    code, _, err = _run(capsys, *command)
    assert code == 1 and "already finished (FAILED: 0 results, 3 errors); nothing to do" in err, err
    assert len(_jobs(out)) == 1
