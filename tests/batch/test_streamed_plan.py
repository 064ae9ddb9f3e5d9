"""A new job on local workers is planned while they predict: each chunk is recorded before it is
handed out, a plan cut short is made again on resume and must repeat every recorded chunk."""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import modelyard
from modelyard.batch import job as jobs
from modelyard.batch import job_plan
from modelyard.batch.readers import iter_plan, plan
from modelyard.batch.spec import BatchError
from tests.batch.conftest import cli_env, rows, write_jsonl


def _csv(path: Path, first_id: int, x: np.ndarray) -> Path:
    lines = ["id,a,b,c,d"] + [f"{first_id + i}," + ",".join(repr(float(v)) for v in r) for i, r in enumerate(x)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_plan_cut_short_is_made_again_checked_and_finished(tiny_model, tmp_path):
    x = rows(400, seed=21)
    a = _csv(tmp_path / "a.csv", 0, x[:300])
    b = tmp_path / "b.csv"
    b.write_bytes(b"\xff\xfeid,a\n1,2\n")  # a header that is not UTF-8: planning fails on this file
    out = tmp_path / "out"

    failed = modelyard.batch_predict(str(tiny_model.base), str(tmp_path / "*.csv"), out, format="csv",
                                     key_field="id", chunk_rows=50, workers=1)
    assert failed.state == jobs.FAILED
    assert "CSV header row cannot be read" in failed.error
    # a.csv's six chunks were recorded (and handed out) before b.csv failed the plan
    record = [json.loads(line) for line in (failed.job_dir / job_plan.PARTIAL_PLAN_FILE).read_text().splitlines()]
    planned_a = plan([record[0][0]], "csv", 50)[0]
    assert Path(record[0][0]) == a and len(planned_a) == 6
    header = ["id", "a", "b", "c", "d"]
    assert record == [[c.file, c.start, c.end, c.rows, c.first_row, header] for c in planned_a]
    assert not (failed.job_dir / job_plan.PLAN_FILE).exists()

    # Mended files are other inputs to a new job (sizes and times name a job's inputs); --resume
    # finishes this one on them. b.csv is readable now, but a.csv no longer holds its planned rows:
    _csv(b, 300, x[300:])
    _csv(a, 0, x[:280])

    def run(**extra):
        return modelyard.batch_predict(resume=failed.job_dir, workers=1, **extra)

    changed = run()
    assert changed.job_dir == failed.job_dir and changed.state == jobs.FAILED
    assert "the input changed since this job started" in changed.error
    assert "chunk 5" in changed.error, changed.error

    _csv(a, 0, x[:300])  # the input the job started on
    shown = io.StringIO()
    finished = run(progress=True, stream=shown)
    assert finished.job_dir == failed.job_dir
    assert finished.state == jobs.SUCCEEDED, finished.error
    assert finished.completion_stats == {"successful_count": 400, "failed_count": 0, "incomplete_count": 0}
    got = {o["key"]: o["prediction"] for o in finished.iter_outputs()}
    assert sorted(got) == list(range(400))
    np.testing.assert_allclose([got[i] for i in range(400)], tiny_model.reference(x), atol=1e-5)
    assert not (finished.job_dir / job_plan.PARTIAL_PLAN_FILE).exists()
    assert "400/400 rows" in shown.getvalue().strip().splitlines()[-1]


def test_workers_predict_the_first_chunks_while_the_rest_is_planned(tiny_model, tmp_path, monkeypatch):
    from modelyard.batch import api

    x = rows(230, seed=22)
    files = [str(_csv(tmp_path / "a.csv", 0, x[:120])), str(_csv(tmp_path / "b.csv", 120, x[120:]))]
    out = tmp_path / "out"
    overlapped = []
    real = api.iter_plan

    def held_after_the_first_chunk(*args):
        for k, item in enumerate(real(*args)):
            yield item
            if k == 0:  # planning waits here until a worker has committed chunk 0
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and not overlapped:
                    overlapped.extend(out.glob("prediction-*/.parts/c000000-ok*-err*.results"))
                    time.sleep(0.01)

    monkeypatch.setattr(api, "iter_plan", held_after_the_first_chunk)
    shown = io.StringIO()
    job = modelyard.batch_predict(str(tiny_model.base), str(tmp_path / "*.csv"), out, format="csv",
                                  key_field="id", chunk_rows=25, workers=2, progress=True, stream=shown)
    assert job.state == jobs.SUCCEEDED, job.error
    assert overlapped, "no chunk was committed before the plan was whole"
    assert job_plan.load_plan(job.job_dir) == plan(files, "csv", 25)
    assert sorted(o["key"] for o in job.iter_outputs()) == list(range(230))
    assert "230/230 rows" in shown.getvalue().strip().splitlines()[-1]


_KILLED_MID_PLAN = r"""
import os, signal, sys, time
from pathlib import Path
import modelyard
from modelyard.batch import api

model, source, out = sys.argv[1:4]
real = api.iter_plan

def killed_after_four_chunks(*args):
    for k, item in enumerate(real(*args)):
        yield item
        if k == 3:  # four chunks handed out: once one is committed, the coordinator dies mid-plan
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not list(Path(out).glob("prediction-*/.parts/c*-ok*.results")):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)

api.iter_plan = killed_after_four_chunks
modelyard.batch_predict(model, source, out, key_field="id", chunk_rows=40, workers=1)
"""


def test_killed_mid_plan_then_resumed_every_row_exactly_once(tiny_model, tmp_path):
    x = rows(1000, seed=23)
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "x": v.tolist()} for i, v in enumerate(x)])
    out = tmp_path / "out"
    killed = subprocess.run([sys.executable, "-c", _KILLED_MID_PLAN, str(tiny_model.base), str(src), str(out)],
                            env=cli_env(), capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    (job_dir,) = out.glob("prediction-*")
    assert not (job_dir / job_plan.PLAN_FILE).exists()
    assert len((job_dir / job_plan.PARTIAL_PLAN_FILE).read_text().splitlines()) == 4
    before = {p.name for p in (job_dir / ".parts").glob("c*-ok*.results")}
    assert before, "the kill should land after a commit"

    said = []
    job = modelyard.batch_predict(str(tiny_model.base), str(src), out, key_field="id", chunk_rows=40, workers=1,
                                  log=said.append)
    assert job.job_dir == job_dir and job.state == jobs.SUCCEEDED, job.error
    assert any(f"{len(before)} of 25 chunks" in line for line in said), said
    assert job.completion_stats == {"successful_count": 1000, "failed_count": 0, "incomplete_count": 0}
    got = [o["key"] for o in job.iter_outputs()]
    assert sorted(got) == list(range(1000))  # each row once: none lost, none twice
    assert job_plan.load_plan(job_dir) == plan([str(src)], "jsonl", 40)


def _cut_short(job_dir: Path, data: Path, fmt: str, handed: int) -> list:
    """Plan ``data`` in chunks of 30 rows, record ``handed`` chunks, then abandon the plan (a failed job)."""
    job_dir.mkdir()
    stream = job_plan.recorded(job_dir, iter_plan([str(data)], fmt, 30))
    given = [next(stream)[0] for _ in range(handed)]
    stream.close()
    assert job_plan.load_plan(job_dir) is None  # the record stays partial: no plan.json
    return given


def test_a_torn_last_record_line_is_a_chunk_never_handed_out(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(f"[{i}]\n" for i in range(100)))
    job_dir = tmp_path / "job"
    handed = _cut_short(job_dir, data, "jsonl", 2)
    with open(job_dir / job_plan.PARTIAL_PLAN_FILE, "a") as f:
        f.write('["' + str(data))  # a kill mid-write
    assert job_plan.planned_rows(job_dir) == 60  # what progress counts against until the plan is whole
    whole = plan([str(data)], "jsonl", 30)
    assert whole[0][:2] == handed
    assert job_plan.finish_partial_plan(job_dir, whole) is True
    assert job_plan.load_plan(job_dir) == whole
    assert job_plan.planned_rows(job_dir) == 100
    assert job_plan.finish_partial_plan(job_dir, whole) is False  # nothing cut short any more


def test_a_record_the_new_plan_does_not_repeat_is_refused(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(f"[{i}]\n" for i in range(100)))
    _cut_short(tmp_path / "job", data, "jsonl", 1)
    data.write_text("".join(f"[{i * 1000}]\n" for i in range(100)))  # longer lines: other byte ranges
    with pytest.raises(BatchError, match="the input changed since this job started: its chunk 0"):
        job_plan.finish_partial_plan(tmp_path / "job", plan([str(data)], "jsonl", 30))
    assert job_plan.load_plan(tmp_path / "job") is None


def test_a_csv_header_rewritten_in_place_is_refused(tmp_path):
    data = _csv(tmp_path / "in.csv", 0, rows(90, seed=24))
    _cut_short(tmp_path / "job", data, "csv", 1)
    data.write_bytes(data.read_bytes().replace(b"id,a,b,c,d", b"id,d,c,b,a", 1))  # same bytes, other columns
    with pytest.raises(BatchError, match="read with \\['id', 'd', 'c', 'b', 'a'\\]"):
        job_plan.finish_partial_plan(tmp_path / "job", plan([str(data)], "csv", 30))
