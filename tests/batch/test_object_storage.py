"""Batch prediction on gs:// and s3://: inputs staged from, results uploaded to, a local GCS emulator
(gcp-storage-emulator) and moto's S3 server; the same results as a local run; clear errors."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

import modelyard
from modelyard.batch import BatchError
from tests.batch.conftest import S3_BUCKET, cli_command, cli_env, rows, write_jsonl
from tests.platform.conftest import STAGING_BUCKET

@pytest.fixture()
def staging(tmp_path, monkeypatch):
    """Remote outputs' local staging directories, per test (inherited by the CLI processes)."""
    path = tmp_path / "staging"
    monkeypatch.setenv("MODELYARD_BATCH_STAGING", str(path))
    return path


def _instances(n: int, seed: int) -> list[dict]:
    return [{"id": f"s{seed}-{i}", "x": v.tolist()} for i, v in enumerate(rows(n, seed))]


def _local_results(tiny_model, tmp_path, files: list, **options) -> list[dict]:
    job = modelyard.batch_predict(str(tiny_model.base), [str(f) for f in files], tmp_path / "local-out",
                                  workers=0, chunk_rows=100, **options)
    assert job.state == "JOB_STATE_SUCCEEDED", job.error
    return sorted(job.iter_outputs(), key=json.dumps)


def _lines(blobs: dict[str, bytes], prefix: str) -> list[dict]:
    return sorted((json.loads(line) for name, data in blobs.items() if name.startswith(prefix)
                   for line in data.decode().splitlines() if line.strip()), key=json.dumps)


def _gcs_objects(client, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` in the staging bucket, by its name relative to the prefix."""
    bucket = client.bucket(STAGING_BUCKET)
    return {b.name[len(prefix):]: bucket.blob(b.name).download_as_bytes()
            for b in client.list_blobs(STAGING_BUCKET, prefix=prefix)}


def _s3_objects(client, prefix: str) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket=S3_BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix):]: client.get_object(Bucket=S3_BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def _only_job(objects: dict[str, bytes]) -> str:
    jobs = {name.split("/", 1)[0] for name in objects}
    assert len(jobs) == 1 and next(iter(jobs)).startswith("prediction-tiny-"), sorted(objects)
    return next(iter(jobs))


def test_gcs_glob_in_and_out_through_the_cli(tiny_model, gcs_emulator, staging, tmp_path):
    client = gcs_emulator["client"]
    bucket = client.bucket(STAGING_BUCKET)
    files = []
    for k, n in ((0, 150), (1, 130)):
        path = write_jsonl(tmp_path / f"part-{k}.jsonl", _instances(n, k))
        bucket.blob(f"batch-cli/in/part-{k}.jsonl").upload_from_filename(str(path))
        files.append(path)
    bucket.blob("batch-cli/in/notes.txt").upload_from_string("not an input")  # outside the glob
    command = cli_command("--model", str(tiny_model.base), "--input", f"gs://{STAGING_BUCKET}/batch-cli/in/*.jsonl",
                          "--output", f"gs://{STAGING_BUCKET}/batch-cli/out/", "--key-field", "id", "--workers", "0",
                          "--chunk-rows", "100", "--no-progress")
    done = subprocess.run(command, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "280 rows" in done.stdout and f"gs://{STAGING_BUCKET}/batch-cli/out/prediction-tiny-" in done.stdout

    objects = _gcs_objects(client, "batch-cli/out/")
    job = _only_job(objects)
    names = sorted(n.split("/", 1)[1] for n in objects)
    assert names == ["job.json", "prediction.errors_stats-00000-of-00001"] + [  # chunks of 100 rows per file
        f"prediction.results-0000{k}-of-00004" for k in range(4)]
    assert _lines(objects, f"{job}/prediction.results") == _local_results(tiny_model, tmp_path, files, key_field="id")
    assert objects[f"{job}/prediction.errors_stats-00000-of-00001"] == b""
    assert json.loads(objects[f"{job}/job.json"])["state"] == "JOB_STATE_SUCCEEDED"
    staged = list(staging.glob("*/prediction-tiny-*"))
    assert len(staged) == 1 and not (staged[0] / ".inputs").exists()  # staged inputs removed once done

    # The same command again: finished, nothing redone; also with the local staging gone (seen remotely).
    for _ in range(2):
        again = subprocess.run(command, env=cli_env(), capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr
        assert "already finished" in again.stderr and "280 results" in again.stderr, again.stderr
        shutil.rmtree(staging)
    assert _gcs_objects(client, "batch-cli/out/") == objects


def test_s3_glob_in_and_out_through_the_api(tiny_model, s3_server, staging, tmp_path):
    files = []
    for k, n in ((2, 120), (3, 90)):
        path = write_jsonl(tmp_path / f"part-{k}.jsonl", _instances(n, k))
        s3_server.upload_file(str(path), S3_BUCKET, f"api/in/part-{k}.jsonl")
        files.append(path)
    job = modelyard.batch_predict(str(tiny_model.base), f"s3://{S3_BUCKET}/api/in/*.jsonl",
                                  f"s3://{S3_BUCKET}/api/out", key_field="id", workers=0, chunk_rows=100)
    assert job.state == "JOB_STATE_SUCCEEDED", job.error
    assert job.completion_stats == {"successful_count": 210, "failed_count": 0, "incomplete_count": 0}
    objects = _s3_objects(s3_server, "api/out/")
    name = _only_job(objects)
    assert job.output_info.gcs_output_directory == f"s3://{S3_BUCKET}/api/out/{name}"
    remote = _lines(objects, f"{name}/prediction.results")
    assert remote == _local_results(tiny_model, tmp_path, files, key_field="id")
    assert sorted(o["key"] for o in remote) == sorted(f"s{k}-{i}" for k, n in ((2, 120), (3, 90)) for i in range(n))
    assert sorted(job.iter_outputs(), key=json.dumps) == remote  # the local mirror holds the same


def test_missing_objects_and_buckets_are_clear_errors(tiny_model, gcs_emulator, s3_server, staging, tmp_path):
    out = tmp_path / "out"
    cases = [
        (f"gs://{STAGING_BUCKET}/nowhere/*.jsonl", "matches no file"),
        (f"gs://{STAGING_BUCKET}/nowhere/one.jsonl", "matches no file"),
        ("gs://no-such-bucket-here/in.jsonl", "no such bucket"),
        (f"s3://{S3_BUCKET}/nowhere/*.jsonl", "matches no file"),
        ("s3://no-such-bucket-here/in.jsonl", "no such bucket"),
        ("ftp://host/in.jsonl", "unsupported scheme"),
    ]
    for uri, words in cases:
        with pytest.raises(BatchError, match=words) as caught:
            modelyard.batch_predict(str(tiny_model.base), uri, out, workers=0)
        assert uri.split("*")[0].rstrip("/") in str(caught.value)
    with pytest.raises(BatchError, match="unsupported scheme"):
        modelyard.batch_predict(str(tiny_model.base), str(write_jsonl(tmp_path / "a.jsonl", _instances(3, 0))),
                                "ftp://host/out", workers=0)
    assert not out.exists() and not staging.exists()  # nothing half-made


def test_missing_backend_says_what_to_install(tiny_model, tmp_path):
    """With s3fs not importable (a stand-in package that fails on import), the CLI says to install it."""
    blocker = tmp_path / "blocked" / "s3fs"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('s3fs is blocked for this test')\n")
    env = cli_env()
    env["PYTHONPATH"] = f"{blocker.parent}{os.pathsep}{env['PYTHONPATH']}"
    done = subprocess.run(cli_command("--model", str(tiny_model.base), "--input", "s3://bucket/in.jsonl",
                                      "--output", str(tmp_path / "out"), "--no-progress"),
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "pip install s3fs" in done.stderr, done.stderr


def test_kill_9_then_the_same_command_resumes_from_the_staging_dir(tiny_model, s3_server, staging, tmp_path,
                                                                    capsys):
    """A remote-output job killed half-way resumes from its local staging directory: every row once on S3."""
    from modelyard.cli import main

    n, chunk = 20_000, 500
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "x": v.tolist()} for i, v in enumerate(rows(n, 9))])
    s3_server.upload_file(str(src), S3_BUCKET, "resume/in/data.jsonl")
    args = ["--no-progress", "--model", str(tiny_model.base), "--input", f"s3://{S3_BUCKET}/resume/in/*.jsonl",
            "--output", f"s3://{S3_BUCKET}/resume/out", "--key-field", "id", "--workers", "1",
            "--chunk-rows", str(chunk), "--batch-size", "32"]
    first = subprocess.Popen(cli_command(*args), env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    committed = lambda: len(list(staging.glob("*/prediction-*/.parts/c*-ok*-err*.results")))  # noqa: E731
    try:
        deadline = time.monotonic() + 120
        while committed() < (n // chunk) // 4 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait()
    at_kill = committed()
    assert 0 < at_kill < n // chunk, f"the kill should land mid-job: {at_kill} chunks committed"
    assert _s3_objects(s3_server, "resume/out/") == {}  # nothing is uploaded before the job is done

    again = args[:]
    again[again.index("--workers") + 1] = "0"  # not part of the job's identity; no second TF import
    assert main(["batch-predict", *again]) == 0
    out = capsys.readouterr()
    assert re.search(r"resuming .*: \d+ of 40 chunks", out.err), out.err
    objects = _s3_objects(s3_server, "resume/out/")
    name = _only_job(objects)
    keys = [o["key"] for o in _lines(objects, f"{name}/prediction.results")]
    assert len(keys) == n and set(keys) == set(range(n)), "every row exactly once"


def test_no_credentials_is_a_clear_error(tiny_model, s3_server, tmp_path):
    env = {k: v for k, v in cli_env().items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env["HOME"] = str(tmp_path)  # no ~/.aws either
    done = subprocess.run(cli_command("--model", str(tiny_model.base), "--input", f"s3://{S3_BUCKET}/api/in/*.jsonl",
                                      "--output", str(tmp_path / "out"), "--no-progress"),
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "no usable credentials" in done.stderr and "AWS_ACCESS_KEY_ID" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_s3_reads_pinned_to_an_etag(s3_server):
    """The Ray engine pins every read of an s3:// input to the ETag its run looked up (``If-Match``):
    the object replaced since, the read fails saying so instead of returning the new bytes."""
    from modelyard import objstore

    s3_server.put_object(Bucket=S3_BUCKET, Key="pinned/in.jsonl", Body=b"[1]\n[2]\n")
    uri = f"s3://{S3_BUCKET}/pinned/in.jsonl"
    size, _mtime, etag = objstore.describe(uri)
    assert size == 8 and etag
    assert objstore.read_range(uri, 4, 8, etag) == b"[2]\n"
    s3_server.put_object(Bucket=S3_BUCKET, Key="pinned/in.jsonl", Body=b"[3]\n[4]\n")
    with pytest.raises(objstore.StorageError, match=rf"{uri}' changed after it was looked up: the version read "
                                                    rf"is '{re.escape(etag)}', the object's is now '\S+'") as failed:
        objstore.read_range(uri, 4, 8, etag)
    assert failed.value.status == "ABORTED"
    assert objstore.read_range(uri, 4, 8) == b"[4]\n"
