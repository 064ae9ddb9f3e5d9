"""A ``gs://`` base path, as TF Serving serves one: versions found under the prefix, a new one picked
up by the poll, a removed one unloaded (serving/manager/remote_versions.py), over the platform's storage.

The end-to-end test runs one ``modelyard serve`` on a ``--model_config_file`` whose base path is a
``gs://`` prefix that google-cloud-storage uploads the tiny models' versions to; the mirror's own rules
(a changed upload, an upload under way, a storage that cannot be read) are checked one layer down.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import requests

from tests.platform.conftest import STAGING_BUCKET
from tests.serving.server_process import ServerProcess


def _upload(client, version_dir: Path, uri: str, skip_model_file: bool = False) -> None:
    """The version's files under ``uri``, saved_model.pb last (as TensorFlow writes it)."""
    bucket_name, prefix = uri[len("gs://"):].split("/", 1)
    bucket = client.bucket(bucket_name)
    files = sorted((p for p in version_dir.rglob("*") if p.is_file()), key=lambda p: p.name == "saved_model.pb")
    for path in files:
        if skip_model_file and path.name == "saved_model.pb":
            continue
        bucket.blob(f"{prefix}/{path.relative_to(version_dir).as_posix()}").upload_from_filename(str(path))


def _delete(client, uri: str) -> None:
    bucket_name, prefix = uri[len("gs://"):].split("/", 1)
    for blob in list(client.list_blobs(bucket_name, prefix=prefix + "/")):
        blob.delete()


def _wait_for(what: str, check, server: ServerProcess, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline or server.proc.poll() is not None:
            raise AssertionError(f"{what} did not happen in {timeout}s:\n{server.log()[-3000:]}")
        time.sleep(0.2)


def test_serve_a_gs_base_path_picks_up_and_drops_versions(gcs_emulator, tiny_models, tmp_path):
    client = gcs_emulator["client"]
    base = f"gs://{STAGING_BUCKET}/serve-gs-{uuid.uuid4().hex[:8]}/m"
    models, instances = tiny_models["models"], tiny_models["instances"]
    _upload(client, Path(models["tiny1"]["path"]), f"{base}/1")
    config = tmp_path / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "m" base_path: "{base}" model_platform: "tensorflow" '
                      f'model_version_policy {{ all {{}} }} }} }}\n')  # all: a removed version is only unloaded

    def states() -> dict[int, str]:
        answer = requests.get(f"{server.base}/v1/models/m", timeout=5)
        return {int(v["version"]): v["state"] for v in answer.json().get("model_version_status", [])}

    def predict(version: int | None = None) -> list:
        path = f"/v1/models/m/versions/{version}:predict" if version else "/v1/models/m:predict"
        answer = requests.post(server.base + path, json={"instances": instances}, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()["predictions"]

    def close(got: list, want: list) -> bool:
        return all(abs(a - b) < 1e-5 for row_a, row_b in zip(got, want) for a, b in zip(row_a, row_b))

    with ServerProcess("--model_config_file", str(config), "--file_system_poll_wait_seconds", "1",
                       log_dir=tmp_path, env={"MODELYARD_CACHE": str(tmp_path / "cache")}) as server:
        assert states() == {1: "AVAILABLE"}, server.log()[-2000:]  # the start waits for the first load
        assert close(predict(), models["tiny1"]["predictions"])

        _upload(client, Path(models["tiny2"]["path"]), f"{base}/2")  # a new version in the bucket
        _wait_for("version 2 loaded", lambda: states() == {2: "AVAILABLE", 1: "AVAILABLE"}, server)
        assert close(predict(), models["tiny2"]["predictions"])  # the latest
        assert close(predict(1), models["tiny1"]["predictions"])

        _delete(client, f"{base}/2")  # removed from the bucket: unloaded
        _wait_for("version 2 unloaded", lambda: states() == {2: "END", 1: "AVAILABLE"}, server)
        assert close(predict(), models["tiny1"]["predictions"])
        missing = requests.post(f"{server.base}/v1/models/m/versions/2:predict", json={"instances": instances},
                                timeout=30)
        assert missing.status_code == 404, missing.text


def test_the_mirror_follows_the_bucket(gcs_emulator, tiny_models, tmp_path, monkeypatch):
    """One layer down (no server): what the mirror holds as a version is uploaded, changed, half
    uploaded, removed, and while the storage cannot be read."""
    from modelyard.serving.manager import remote_versions
    from modelyard.serving.manager.versions import VersionPolicy, fingerprint, missing_base_path, version_dirs

    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "cache"))
    client = gcs_emulator["client"]
    base = f"gs://{STAGING_BUCKET}/mirror-{uuid.uuid4().hex[:8]}/m"
    tiny1, tiny2 = (Path(tiny_models["models"][n]["path"]) for n in ("tiny1", "tiny2"))

    assert version_dirs(base) == {}
    assert "base path gs://" in missing_base_path(base), "an empty prefix reads as a missing base path"

    _upload(client, tiny1, f"{base}/1")
    _upload(client, tiny2, f"{base}/2", skip_model_file=True)  # under way: no saved_model.pb yet
    found = version_dirs(base)
    assert list(found) == [1] and missing_base_path(base) is None
    assert (found[1] / "saved_model.pb").read_bytes() == (tiny1 / "saved_model.pb").read_bytes()
    assert sorted(p.relative_to(found[1]) for p in found[1].rglob("*") if p.is_file()) == \
        sorted(p.relative_to(tiny1) for p in tiny1.rglob("*") if p.is_file())
    before = fingerprint(found[1])

    _upload(client, tiny2, f"{base}/2")
    latest = version_dirs(base, VersionPolicy())  # TF Serving's default policy: only version 2 is fetched
    assert list(latest) == [2] and [p.name for p in latest[2].parent.joinpath(remote_versions.ENTRIES).iterdir()] \
        == [latest[2].resolve().name]
    assert sorted(version_dirs(base)) == [1, 2]
    assert fingerprint(found[1]) == before, "an unchanged version is not fetched again"

    _upload(client, tiny2, f"{base}/1")  # version 1 replaced by other bytes: a new entry under the same path
    assert (version_dirs(base)[1] / "variables" / "variables.data-00000-of-00001").read_bytes() == \
        (tiny2 / "variables" / "variables.data-00000-of-00001").read_bytes()
    mirror = remote_versions.mirror_dir(base)
    assert len(list((mirror / remote_versions.ENTRIES).iterdir())) == 2, "the replaced entry is removed"

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens: kept as it was
    assert sorted(version_dirs(base)) == [1, 2]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator["host"])

    _delete(client, f"{base}/2")
    assert sorted(version_dirs(base)) == [1]
    _delete(client, base)
    assert version_dirs(base) == {} and missing_base_path(base) is not None
    assert not list((mirror / remote_versions.ENTRIES).iterdir()), "nothing is kept of a removed version"


def test_a_config_files_gs_base_path_is_kept_and_needs_the_storage(monkeypatch):
    """A --model_config_file's gs:// base_path stays a URI (TF Serving takes it; a Path would make it the
    relative gs:/b/m, refused as not absolute); without STORAGE_EMULATOR_HOST it is refused naming it."""
    import pytest

    from modelyard.errors import ServingError
    from modelyard.serving.manager.config import config_proto, model_configs, parse_model_server_config

    text = 'model_config_list { config { name: "m" base_path: "gs://b/models/m/" model_platform: "tensorflow" } }'
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    [config] = model_configs(parse_model_server_config(text))
    assert config.base_path == "gs://b/models/m"
    assert config_proto([config]).model_config_list.config[0].base_path == "gs://b/models/m"  # to --workers' peers
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    with pytest.raises(ServingError, match="Model m: base path gs://b/models/m/ is in Cloud Storage, and "
                                           "STORAGE_EMULATOR_HOST is not set"):
        model_configs(parse_model_server_config(text))


def test_the_mirror_sends_the_storage_token(tmp_path, monkeypatch):
    """Behind --auth-token (MODELYARD_PLATFORM_TOKEN) the storage answers a poll without the token 401,
    logged and nothing served; with MODELYARD_STORAGE_TOKEN, as every client of the storage, the
    listing and the download both go through."""
    import google.oauth2.credentials
    from google.cloud import storage

    from modelyard.serving.manager.versions import version_dirs
    from tests.platform.conftest import wait_http
    from tests.storage_server import StorageProcess

    token = "mirror-test-token"
    server = StorageProcess(tmp_path / "root", tmp_path / "storage.log",
                            env={**os.environ, "MODELYARD_PLATFORM_TOKEN": token})
    try:
        wait_http(server.url + "/storage/v1/b", 30, server.proc, server.log)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
        monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        client = storage.Client(project="local", credentials=google.oauth2.credentials.Credentials(token))
        bucket = client.create_bucket("token-mirror")
        bucket.blob("m/7/variables/variables.index").upload_from_string(b"index")
        bucket.blob("m/7/saved_model.pb").upload_from_string(b"graph")
        monkeypatch.delenv("MODELYARD_STORAGE_TOKEN", raising=False)
        assert version_dirs("gs://token-mirror/m") == {}
        monkeypatch.setenv("MODELYARD_STORAGE_TOKEN", token)
        found = version_dirs("gs://token-mirror/m")
        assert list(found) == [7] and (found[7] / "saved_model.pb").read_bytes() == b"graph"
        assert (found[7] / "variables" / "variables.index").read_bytes() == b"index"
    finally:
        server.stop()


def test_workers_sync_one_mirror_one_at_a_time(gcs_emulator, tiny_models, tmp_path):
    """Two processes (as --workers' are) syncing the same gs:// base path at once: one fetch, one link."""
    import subprocess
    import sys

    base = f"gs://{STAGING_BUCKET}/workers-{uuid.uuid4().hex[:8]}/m"
    _upload(gcs_emulator["client"], Path(tiny_models["models"]["tiny1"]["path"]), f"{base}/1")
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
            "from modelyard.serving.manager.versions import VersionPolicy, version_dirs\n"
            f"print('found', {{v: str(p.resolve()) for v, p in version_dirs({base!r}, VersionPolicy()).items()}})")
    env = {**os.environ, "MODELYARD_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert sum(out.count("Fetching version 1") for out in outputs) == 1, outputs
    found = {line for out in outputs for line in out.splitlines() if line.startswith("found")}
    assert len(found) == 1 and "/.v/1-" in found.pop(), outputs


def test_model_roots_refuse_a_gs_base_path_by_its_name(monkeypatch):
    """--model_roots keeps a server to local roots: a gs:// base path is refused, named as written
    (Path would print it as the local gs:/b/m)."""
    import pytest

    from modelyard.errors import ServingError
    from modelyard.serving.manager.manager import ModelConfig
    from modelyard.serving.security.paths import check_model_paths

    with pytest.raises(ServingError, match="Model m: base path gs://b/m is outside --model_roots"):
        check_model_paths([ModelConfig("m", "gs://b/m")], ("/srv/models",))
