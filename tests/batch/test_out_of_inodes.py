"""Issue 35, must-show 5: ``batch-predict`` whose output file system runs out of inodes at each of its
bookkeeping files (the job's directory and ``job.json``, ``.lock``, the plan, the parts, the
finalize record): a one-line error and a non-zero exit, never a traceback; a ``job.json`` that is
whole (its previous state, or FAILED with the error and the committed counts); and the same command,
once inodes are back, finishes the job with every row exactly once. The output is a small tmpfs
(``nr_inodes``), so the test needs root. In process (``--workers 0``): TensorFlow is imported once."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from modelyard.batch.shards import committed
from modelyard.cli import main
from tests.batch.conftest import read_lines, rows, write_jsonl

ROWS = 2000


def test_out_of_inodes_fails_in_one_line_and_the_same_command_resumes(tiny_model, tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.fail("this test mounts a tmpfs with few inodes as the job's output: run it as root")
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "x": v.tolist()} for i, v in enumerate(rows(ROWS, 11))])
    # 2: the job's directory only; 3: + job.json; 4: + .lock; 5+: the plan, .parts, parts, finalize.
    for inodes in (2, 3, 4, 5, 7, 12):
        out = tmp_path / f"out-{inodes}"
        out.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=16m,nr_inodes={inodes}", "tmpfs", str(out)],
                       check=True)
        try:
            args = ["batch-predict", "--no-progress", "--model", str(tiny_model.base), "--input", str(src),
                    "--output", str(out), "--key-field", "id", "--workers", "0", "--chunk-rows", "250"]
            rc = main(args)
            err = capsys.readouterr().err
            assert rc != 0, f"{inodes} inodes: the job did not fail"
            assert "Traceback" not in err, err
            last = err.strip().splitlines()[-1]
            assert last.startswith("modelyard batch-predict: ") and "No space left on device" in last, err
            for record in out.glob("prediction-*/job.json"):
                data = json.loads(record.read_text())  # whole: written atomically
                assert data["state"] in ("JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_FAILED"), data
                if data["state"] == "JOB_STATE_FAILED":
                    done = committed(record.parent).values()
                    assert data["error"] and data["completion_stats"]["successful_count"] == sum(c[0] for c in done)
            subprocess.run(["mount", "-o", "remount,nr_inodes=10000", str(out)], check=True)
            assert main(args) == 0, capsys.readouterr().err
            capsys.readouterr()
            finished = [d for d in out.glob("prediction-*") if (d / "job.json").is_file()
                        and json.loads((d / "job.json").read_text())["state"] == "JOB_STATE_SUCCEEDED"]
            assert len(finished) == 1, list(out.iterdir())
            keys = [o["key"] for s in sorted(finished[0].glob("prediction.results-*")) for o in read_lines(s)]
            assert sorted(keys) == list(range(ROWS)), f"{inodes} inodes: not every row exactly once"
        finally:
            subprocess.run(["umount", "-l", str(out)], check=False)
