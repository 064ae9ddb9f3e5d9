"""Issue 44, point 6: docs/vertex-sdk.md runs as written against the session platform.

The page's Python blocks run in order in one Python process, as a user types them into one session
(tests/test_docs.py's way; the SDK's job polling made quicker, as the platform tests' fixture does); its ``# FILE.py`` blocks are the files the others name, written into the
session's folder first. The preamble is the page's own, with the session platform's URLs for the
page's ports and the session's staging bucket (the platform's ``--artifact-root``) for ``my-bucket``:
the rest is verbatim. tests/test_docs.py lists the page's blocks as run here.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.doc_blocks import blocks
from tests.platform.conftest import STAGING_BUCKET, _env
from tests.platform.jobs_helpers import no_stray_jobs  # noqa: F401

PAGE = Path(__file__).resolve().parents[2] / "docs" / "vertex-sdk.md"
_FILE = re.compile(r"# (\w+\.py)$")
# One session: every block of the page, in order, in one namespace (as tests/test_docs.py runs a page).
_SESSION = """
import sys, time
# The harness's only change to the SDK (as the jobs_helpers fixture does in process): jobs polled every
# 0.5 s rather than 5 s, so a job done in 9 s is not seen at 10 s. The page's blocks are untouched.
from google.cloud.aiplatform import jobs, training_jobs
jobs._JOB_WAIT_TIME = training_jobs._JOB_WAIT_TIME = 0.5
ns = {"__name__": "__main__"}
for path in sys.argv[1:]:
    start = time.monotonic()
    exec(compile(open(path).read(), path, "exec"), ns)
    print(f"[{path.rsplit('/', 1)[-1]} took {time.monotonic() - start:.1f} s]", file=sys.stderr, flush=True)
"""


def page_python() -> tuple[dict[str, str], list[str]]:
    """The page's files (``# NAME.py`` blocks) and the code of its other Python blocks, in order."""
    files, code = {}, []
    for block in blocks(PAGE.read_text()):
        if block.lang != "python":
            continue
        name = _FILE.match(block.body.splitlines()[0])
        if name:
            files[name.group(1)] = block.body
        else:
            code.append(block.body)
    return files, code


def test_vertex_sdk_page_runs_as_written(platform, tmp_path):
    files, code = page_python()
    assert set(files) == {"trial.py", "task.py"} and len(code) == 5
    preamble = code[0]
    for mine, session in (('"http://localhost:8600"', f'"{platform.url}"'),
                          ('"http://127.0.0.1:8601"', f'"{platform.storage_url}"'),
                          ('"my-bucket"', f'"{STAGING_BUCKET}"')):
        assert preamble.count(mine) == 1, mine
        preamble = preamble.replace(mine, session)
    assert "my-bucket" not in "".join(code[1:]) and "8600" not in "".join(code[1:])  # only the preamble says where
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    paths = []
    for i, body in enumerate([preamble, *code[1:]]):
        paths.append(tmp_path / f"vertex_sdk_block_{i}.py")
        paths[-1].write_text(body)
    done = subprocess.run([sys.executable, "-c", _SESSION, *map(str, paths)], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=900)
    out = done.stdout
    print("\n".join(line for line in done.stderr.splitlines() if line.startswith("[vertex_sdk_block_")))
    assert done.returncode == 0, f"{out[-3000:]}\n{done.stderr[-5000:]}"
    lines = out.splitlines()
    assert "JOB_STATE_SUCCEEDED" in lines  # the CustomJob
    trials = [line for line in lines if line.startswith("trial ")]
    assert len(trials) == 2 and all(" SUCCEEDED " in t for t in trials), out
    assert all(float(t.rsplit("accuracy ", 1)[1]) > 0.5 for t in trials), out  # each measured (chance: 0.1)
    (summary,) = [line for line in lines if line.endswith(" right")]
    count, right = re.fullmatch(r"(\d+) predictions, (\d+) right", summary).groups()
    assert count == "100" and int(right) >= 80, out  # every row predicted, by the model the script trained
