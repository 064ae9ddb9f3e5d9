"""A plain clone (no ../shared next to it) runs green: CI checks it on every run.

CI always has TF Serving's test models in ../shared, so the path a plain clone takes would
otherwise never run there. This runs pytest itself on a small subset (a serving test behind
tests/serving/conftest.py, the inspect and TFLite-conversion tests on the TF1 model) with
MODELYARD_TFSERVING_TESTDATA pointing at a missing folder, as a clone of the repository alone sees it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUBSET = [
    "tests/serving/test_tfserving_models.py::test_rest_metadata_equals_tf_serving",
    "tests/serving/test_tfserving_generated.py",
    "tests/test_inspect.py::test_text_matches_saved_model_cli_layout",
    "tests/test_inspect.py::test_broken_export_is_a_clear_error",
    "tests/edge/test_half_plus_two.py::test_computes_half_plus_two",
]


def test_suite_without_shared_testdata_is_green_and_says_what_did_not_run(tmp_path):
    missing = tmp_path / "no-shared" / "testdata" / "tfserving"
    env = {**os.environ, "MODELYARD_TFSERVING_TESTDATA": str(missing), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "addopts=-ra",
         "--basetemp", str(tmp_path / "basetemp"), *SUBSET],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    assert f"conformance on TF Serving's own test models: not run ({missing} not found)" in out, out[-2000:]
    # Every model test ran on the generated stand-ins, none on TF Serving's files...
    for test in ("test_rest_metadata_equals_tf_serving[generated]",
                 "test_text_matches_saved_model_cli_layout[generated]",
                 "test_broken_export_is_a_clear_error[generated]",
                 "test_computes_half_plus_two[generated]"):
        assert f"{test} PASSED" in out, out[-4000:]
    assert "[tfserving" not in out
    # ...and the check against TF Serving's own files says why it did not run.
    assert "SKIPPED" in out and f"not run ({missing} not found)" in out.split("short test summary info")[-1]
