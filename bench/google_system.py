"""Google's own system tests of the Vertex SDK, unedited, against a local ``modelyard platform``.

    python3 bench/google_system.py [FILE ...] [--cache DIR] [--timeout S] [--keep] [--out FILE]

FILE: test files of tests/system/aiplatform in google-cloud-aiplatform, by name (``test_experiments`` or
``test_experiments.py``, optionally ``::Class::test`` to pick tests). Default: issue 45's yardstick,
``test_experiments test_autologging test_tensorboard test_e2e_metadata_schema test_experiment_model``; others
run the same way (e.g. ``test_custom_job test_pipeline_job test_pipeline_job_schedule
test_model_version_management test_project_id_inference test_vizier``).

Needs the test extra and what ``scripts/test`` installs beside it (kfp for test_experiments' pipeline, the
SDK's MLflow for test_autologging), as the platform tests do.

What it does:
- the sdist of the installed google-cloud-aiplatform (the tests of exactly that SDK) from PyPI with
  ``pip download --no-binary :all: --no-deps``, kept in --cache (default ``~/.cache/modelyard/google-system``);
  its ``tests/system/aiplatform`` extracted into a temporary directory;
- one ``modelyard platform`` with ``--store`` and its state, storage included, in that temporary directory;
- one pytest per file in that directory, with ``google_system_plugin`` (beside this script), which only points
  the stock clients at the platform (API host, anonymous credentials, Cloud Resource Manager's host, Cloud
  Storage's emulator host, the project e2e_base reads); the test bodies are Google's. TensorFlow's own gs://
  goes to the platform's storage through ``modelyard.tf_gcs``'s gateway (its variables in the tests' environment);
- Google's sample objects the tests download from ``gs://cloud-samples-data-us-central1`` (not reachable here)
  are written into the platform's storage under the same names, made here of the same kind (``seed_samples``);
- a table: test id, outcome (pass / FAIL / ERROR in setup or teardown / skipped), seconds, the first line of the
  failure (or the skip reason), and for tests that cannot pass for a reason outside the platform (a product
  only Google runs, a client library's behaviour), why (``NOT_THE_PLATFORM``); printed and written to
  bench/results/google_system.md (--out).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from modelyard import tf_gcs

from harness import command_line, env, free_port, log, machine, markdown_table, modelyard_platform, port_open, \
    write_results

BENCH = Path(__file__).resolve().parent
PACKAGE = "google-cloud-aiplatform"
TESTS = "tests/system/aiplatform"
PROJECT = "local"
ISSUE_45 = ["test_experiments", "test_autologging", "test_tensorboard", "test_e2e_metadata_schema",
            "test_experiment_model"]
# Tests that cannot pass here for a reason outside the platform, by test id (or a prefix of one): a product
# only Google runs, or a client library's behaviour. Shown beside a test only when it does not pass.
STALE_ETAG_OVER_REST = (
    "transport: the SDK re-reads a context and retries a stale-etag update only on gRPC's ABORTED "
    "(metadata/context.py catches `Aborted`; over REST google-api-core makes a 409 a `Conflict`, its message "
    "prefixed with the request, so no retry). The platform serves Vertex's REST API, not its gRPC one, so the "
    "SDK runs with api_transport='rest'; the SDK would not retry against Vertex over REST either")
TF_NEWER_THAN_IMAGES = (
    "client side: the test compares versions as strings (the newest of the SDK's TensorFlow images is then '2.9', "
    "'2.9' >= '2.21.0'), so it calls register_model() without an image, and the SDK refuses the installed "
    "TensorFlow 2.21 (its newest prebuilt image is 2.15) before sending a request; with a TensorFlow it has an "
    "image for (<= 2.15) the SDK picks that image")
NOT_THE_PLATFORM: dict[str, str] = {
    "test_experiment_model::TestExperimentModel::test_tensorflow_keras_model_with_input_example": TF_NEWER_THAN_IMAGES,
    "test_experiment_model::TestExperimentModel::test_tensorflow_module_with_gpu_container": TF_NEWER_THAN_IMAGES,
    "test_project_id_inference::TestProjectIDInference::test_project_id_inference":
        "network: the job's command installs the SDK from github.com (pip install git+https://github.com/"
        "googleapis/python-aiplatform@main), which this machine cannot reach",
    "test_experiment_model::TestExperimentModel::test_deploy_model_with_gpu_container":
        "deploys a model test_tensorflow_module_with_gpu_container registers (none: see there)",
    "test_experiments::TestExperiments::test_delete_backing_tensorboard_experiment_run_success":
        STALE_ETAG_OVER_REST,
    "test_custom_job::TestCustomJob::test_from_local_script_enable_autolog_prebuilt_container":
        STALE_ETAG_OVER_REST,
    "test_autologging::TestAutologging::test_autologging_with_autorun_creation":
        "client side: MLflow's scikit-learn autolog names the metric `training_mean_absolute_error` in the "
        "installed MLflow 2.16 (the newest the SDK allows below Python 3.13); `training_mae` is the name it had "
        "before mlflow/mlflow#7418 named autolog's metrics as mlflow.evaluate does",
}
SAMPLES_BUCKET = "cloud-samples-data-us-central1"
XGBOOST_SAMPLE = "vertex-ai/google-cloud-aiplatform-ci-artifacts/models/iris_xgboost/model.bst"


def sdist(cache: Path) -> Path:
    """The installed SDK's sdist, downloaded once into ``cache``."""
    version = importlib.metadata.version(PACKAGE)
    name = f"google_cloud_aiplatform-{version}.tar.gz"
    path = cache / name
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        log(f"downloading the sdist of {PACKAGE}=={version} from PyPI into {cache}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-q",
                        "-d", str(cache), f"{PACKAGE}=={version}"], check=True)
    if not path.exists():
        sys.exit(f"pip download left no {name} in {cache}")
    return path


def extract_tests(archive: Path, into: Path) -> Path:
    """tests/__init__.py, tests/system/__init__.py and tests/system/aiplatform/** of the sdist, under ``into``."""
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/", 1)[0]
        wanted = (f"{top}/tests/__init__.py", f"{top}/tests/system/__init__.py")
        members = [m for m in tar.getmembers()
                   if (m.name in wanted or m.name.startswith(f"{top}/{TESTS}/")) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name.split("/", 1)[1]
        tar.extractall(into, members=members, filter="data")
    # Its own rootdir: pytest must not climb into a checkout's configuration.
    (into / "pytest.ini").write_text("[pytest]\naddopts =\n")
    # The plugin beside the tests (pytest runs there: its directory is first on sys.path), not bench/ on the
    # path, whose vizier.py would hide the google-vizier package test_vizier imports.
    shutil.copy(BENCH / "google_system_plugin.py", into / "google_system_plugin.py")
    return into / TESTS


def seed_samples(storage_root: Path) -> None:
    """Google's public sample objects the tests read, made here: an XGBoost Booster trained on iris, saved
    as model.bst (what the sample is), in the platform's storage under the sample's bucket and name."""
    import xgboost as xgb
    from sklearn.datasets import load_iris

    iris = load_iris()
    booster = xgb.train({"objective": "multi:softprob", "num_class": 3},
                        xgb.DMatrix(iris.data, label=iris.target), num_boost_round=5)
    path = storage_root / SAMPLES_BUCKET / XGBOOST_SAMPLE
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _cell(text: str, limit: int = 260) -> str:
    # An HTTP error's first line starts with the whole request URL: its host, parent and query say nothing.
    text = re.sub(r"http://127\.0\.0\.1:\d+/v1/projects/[^/]+/locations/[^/]+/", ".../", text)
    text = re.sub(r"\?%24alt=json%3Benum-encoding%3Dint", "", text)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def parse_junit(path: Path, file_stem: str) -> list[dict]:
    """One row per test case of pytest's JUnit XML: id, outcome, seconds, first line of its message."""
    rows = []
    if not path.exists():
        return rows
    for case in ET.parse(path).getroot().iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        test_id = f"{file_stem}::{cls}::{case.get('name')}"
        outcome, message = "pass", ""
        for child in case:
            if child.tag == "failure":
                outcome, message = "FAIL", _first_line(child.get("message")) or _first_line(child.text)
            elif child.tag == "error":  # in setup, teardown or collection: the exception's own line says why
                said = child.get("message") or ""
                phase = "teardown" if "teardown" in said else "collection" if "collection" in said else "setup"
                outcome = f"ERROR ({phase})"
                message = _first_line(_error_line(child.text)) or _first_line(said)
            elif child.tag == "skipped":
                outcome, message = "skipped", _first_line(child.get("message"))
        rows.append({"id": test_id, "outcome": outcome, "seconds": float(case.get("time", 0)), "message": message})
    return rows


def _error_line(text: str | None) -> str:
    """The ``E   ...`` line of a traceback: the exception as pytest shows it."""
    for line in (text or "").splitlines():
        if line.startswith("E "):
            return line[1:].strip()
    return text or ""


def run_file(spec: str, tests_dir: Path, work: Path, child_env: dict, timeout: float) -> list[dict]:
    name, _, select = spec.partition("::")
    stem = name.removesuffix(".py")
    path = tests_dir / f"{stem}.py"
    if not path.exists():
        sys.exit(f"no {TESTS}/{stem}.py in the sdist")
    junit = work / f"{stem}.xml"
    target = str(path.relative_to(work)) + (f"::{select}" if select else "")
    cmd = [sys.executable, "-m", "pytest", "-p", "google_system_plugin", "-p", "no:cacheprovider", "-q", "-rA",
           "--rootdir", str(work), f"--junitxml={junit}", "-o", "junit_family=xunit1",
           f"--timeout={timeout}", target]
    log(f"running {target}")
    started = time.monotonic()
    with open(work / f"{stem}.log", "wb") as out:
        proc = subprocess.run(cmd, cwd=work, env=child_env, stdout=out, stderr=subprocess.STDOUT)
    log(f"{stem}: pytest exit {proc.returncode} after {time.monotonic() - started:.0f} s (log {work / stem}.log)")
    rows = parse_junit(junit, stem)
    if not rows:  # it could not even collect: one row saying why
        text = (work / f"{stem}.log").read_text(errors="replace")
        rows = [{"id": stem, "outcome": "ERROR (collection)", "seconds": 0.0,
                 "message": _first_line(_error_line(text)) or f"pytest exit {proc.returncode}"}]
    return rows


def not_the_platform(test_id: str) -> str:
    for prefix, why in NOT_THE_PLATFORM.items():
        if test_id.startswith(prefix):
            return why
    return ""


def report(rows: list[dict], files: list[str], version: str) -> str:
    counts = {k: sum(1 for r in rows if r["outcome"].split()[0] == k) for k in ("pass", "FAIL", "ERROR", "skipped")}
    table = markdown_table(
        ["test", "outcome", "s", "first line of the failure / skip reason", "why, when not the platform"],
        [[r["id"], r["outcome"], f"{r['seconds']:.1f}", _cell(r["message"]), not_the_platform(r["id"]) if
          r["outcome"] != "pass" else ""] for r in rows], align="llrll")
    return "\n".join([
        "# Google's Vertex SDK system tests against modelyard platform", "",
        machine(), "", f"`{command_line()}`", "",
        f"google-cloud-aiplatform {version}: `tests/system/aiplatform` of its PyPI sdist, unedited; files: "
        + ", ".join(f"`{f}`" for f in files) + ". One `modelyard platform` (SQLite store, its own Cloud Storage); "
        "the stock clients pointed at it by `bench/google_system_plugin.py` (REST transport, anonymous "
        f"credentials, project `{PROJECT}`). Google's sample `gs://{SAMPLES_BUCKET}/{XGBOOST_SAMPLE}` is a "
        "locally trained iris XGBoost Booster in the platform's storage.", "",
        f"{counts['pass']} passed, {counts['FAIL']} failed, {counts['ERROR']} errors, {counts['skipped']} skipped "
        f"of {len(rows)}.", "", table])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("files", nargs="*", default=ISSUE_45)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "modelyard" / "google-system"
    ap.add_argument("--cache", type=Path, default=cache, help=f"where the sdist is kept (default {cache})")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one test may take (pytest-timeout)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, the platform's store)")
    ap.add_argument("--out", default=None, help="results file (default bench/results/google_system.md)")
    args = ap.parse_args()

    version = importlib.metadata.version(PACKAGE)
    archive = sdist(args.cache)
    work = Path(tempfile.mkdtemp(prefix="google-system-"))
    tests_dir = extract_tests(archive, work)
    storage_root, storage_port = work / "storage", free_port()
    storage_root.mkdir()
    seed_samples(storage_root)
    rows: list[dict] = []
    with modelyard_platform(work / "platform", "--storage-port", str(storage_port),
                            "--storage-root", str(storage_root)) as platform:
        platform.wait(port_open(storage_port), 60)
        # TensorFlow's own gs:// (the SDK's save_model of a Keras model or tf.Module) has Google's hosts compiled
        # in: modelyard.tf_gcs's gateway takes them (HTTPS_PROXY and CURL_CA_BUNDLE, in os.environ from here on).
        tf_gcs.enable(f"http://127.0.0.1:{storage_port}")
        child_env = env(
            MODELYARD_GOOGLE_SYSTEM_API=platform.base, BUILD_SPECIFIC_GCLOUD_PROJECT=PROJECT,
            GOOGLE_CLOUD_PROJECT=PROJECT, STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{storage_port}")
        try:
            for spec in args.files:
                rows += run_file(spec, tests_dir, work, child_env, args.timeout)
        finally:
            tf_gcs.disable()
    write_results("google_system", report(rows, args.files, version), args.out)
    if args.keep:
        log(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
