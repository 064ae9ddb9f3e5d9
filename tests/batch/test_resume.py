"""Exactly-once resume: a real ``modelyard batch-predict`` killed with SIGKILL half-way, then run again.

The killed run is a real process with a worker process. The resume and the re-run of the
finished job go through the same CLI entry point in this process (``modelyard.cli.main``, same
arguments but ``--workers 0``, which is not part of a job's identity), because each new process
imports TensorFlow again (10-20 s on the shared CI machine) and the test budget is 90 s.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from modelyard.cli import main
from tests.batch.conftest import cli_command, cli_env, read_lines, rows, write_jsonl

ROWS = 60_000
CHUNK = 500
PART = re.compile(r"^c\d{6}-ok\d+-err\d+\.results$")


def _committed(out) -> int:
    parts = [p for job in out.glob("prediction-*") for p in (job / ".parts").glob("*.results")]
    return sum(1 for p in parts if PART.match(p.name))


def test_kill_9_half_way_then_resume_exactly_once(tiny_model, tmp_path, capsys):
    x = rows(ROWS, seed=5)
    lines = [{"id": i, "x": v.tolist()} for i, v in enumerate(x)]
    for bad in (3, 31_000, 59_998):
        lines[bad] = {"id": bad, "x": [0.0]}
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out"
    command = cli_command("--no-progress", "--model", str(tiny_model.base), "--input", str(src), "--output", str(out),
                          "--key-field", "id", "--workers", "1", "--chunk-rows", str(CHUNK), "--batch-size", "32")
    total = ROWS // CHUNK
    first = subprocess.Popen(command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while _committed(out) < total * 2 // 5 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait()
    at_kill = _committed(out)
    assert 0 < at_kill < total, f"the kill should land mid-job: {at_kill} of {total} chunks committed"
    time.sleep(1.0)
    # The workers die with the coordinator (PR_SET_PDEATHSIG): nothing commits after the kill.
    assert _committed(out) <= at_kill + 2  # at most the chunks being renamed at the instant of the kill
    frozen = _committed(out)
    time.sleep(0.5)
    assert _committed(out) == frozen

    again = command[command.index("batch-predict"):]
    again[again.index("--workers") + 1] = "0"
    assert main(again) == 0
    second = capsys.readouterr()
    assert re.search(rf"resuming .*: {frozen} of {total} chunks", second.err), second.err
    assert "JOB_STATE_SUCCEEDED: 59,997 results, 3 errors, 60,000 rows" in second.out
    (job_dir,) = out.iterdir()
    shards = sorted(job_dir.glob("prediction.results-*"))
    assert [s.name for s in shards] == [f"prediction.results-{k:05d}-of-{total:05d}" for k in range(total)]
    keys = [o["key"] for s in shards for o in read_lines(s)]
    errors = read_lines(job_dir / "prediction.errors_stats-00000-of-00001")
    keys += [e["key"] for e in errors]
    assert len(keys) == ROWS and set(keys) == set(range(ROWS)), "every row exactly once"
    assert sorted(e["key"] for e in errors) == [3, 31_000, 59_998]
    assert not (job_dir / ".parts").exists()

    before = {s.name: s.stat().st_mtime_ns for s in job_dir.iterdir()}
    assert main(again) == 0
    third = capsys.readouterr()
    assert "already finished (SUCCEEDED: 59,997 results, 3 errors); nothing to do" in third.err
    assert {s.name: s.stat().st_mtime_ns for s in job_dir.iterdir()} == before
    assert "runs on" not in third.err  # no model was loaded


def test_resume_flag_finishes_the_named_job(tiny_model, tmp_path):
    """``--resume JOB_DIR`` alone finishes a job whose parts were partly committed (in-process run)."""
    import modelyard
    from modelyard.batch import job as jobs
    from modelyard.batch.shards import committed

    src = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "x": v.tolist()} for i, v in enumerate(rows(500, seed=6))])
    job = modelyard.batch_predict(str(tiny_model.base), str(src), tmp_path / "out", key_field="id",
                                  chunk_rows=100, workers=0)
    assert job.state == jobs.SUCCEEDED
    # A crash before finalize leaves parts; simulate it by re-planning the same job by hand.
    fresh = jobs.create_job(tmp_path / "out2", job.spec)
    partial = modelyard.batch_predict(resume=fresh.job_dir, workers=0)
    assert partial.state == jobs.SUCCEEDED
    assert committed(partial.job_dir) == {}
    assert sorted(o["key"] for o in partial.iter_outputs()) == list(range(500))
    assert os.path.basename(partial.output_info.gcs_output_directory).startswith("prediction-tiny-")


def test_a_worker_killed_mid_job_fails_it_saying_how_and_the_rerun_finishes_it(tiny_model, tmp_path):
    """A worker process dying (OOM killer, kill -9) fails the job with the signal's name; the same
    call again finishes it, every row once."""
    import multiprocessing
    import threading

    import modelyard
    from modelyard.batch import job as jobs

    src = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "x": v.tolist()} for i, v in enumerate(rows(ROWS, seed=7))])
    out = tmp_path / "out"
    killed = []

    def kill_the_worker_after_a_commit() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _committed(out) < 2:
            time.sleep(0.005)
        for child in multiprocessing.active_children():  # the job's worker processes
            os.kill(child.pid, signal.SIGKILL)
            killed.append(child.pid)

    killer = threading.Thread(target=kill_the_worker_after_a_commit)
    killer.start()
    args = dict(key_field="id", chunk_rows=CHUNK, batch_size=256, workers=1)
    failed = modelyard.batch_predict(str(tiny_model.base), str(src), out, **args)
    killer.join()
    assert killed, "no worker to kill"
    assert failed.state == jobs.FAILED, "the kill should land mid-job"
    assert f"worker pid {killed[0]} was killed by SIGKILL (out of memory, or killed)" in failed.error
    assert "run the same command again to resume" in failed.error

    finished = modelyard.batch_predict(str(tiny_model.base), str(src), out, **args)
    assert finished.job_dir == failed.job_dir and finished.state == jobs.SUCCEEDED, finished.error
    assert sorted(o["key"] for o in finished.iter_outputs()) == list(range(ROWS))
