"""``--artifact-root`` (issue 43 finding 2, issue 44's friction): roots match on whole path segments
(``gs://stage`` never admits ``gs://stage-evil/...``), one rule for local and remote roots; and a remote
root whose bucket does not exist stops the platform's start, as a local root that is not a directory does."""
from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from modelyard.platform.api.errors import ApiError
from modelyard.platform.resources import artifacts
from modelyard.ports import free_port
from tests.platform.conftest import PARENT, STAGING_BUCKET, _env
from tests.platform.test_bad_input import google_error


@pytest.mark.parametrize("location, root, inside", [
    ("gs://stage/m/0001", "gs://stage", True),
    ("gs://stage", "gs://stage/", True),
    ("gs://stage//m", "gs://stage", True),
    ("gs://stage-evil/m/0001", "gs://stage", False),
    ("gs://stage-evil", "gs://stage", False),
    ("gs://stage/models-old/m", "gs://stage/models", False),
    ("gs://stage/models/m", "gs://stage/models", True),
    ("s3://stage/m", "gs://stage", False),
    ("gs://other/stage/m", "gs://stage", False),
    ("/srv/models/m/0001", "/srv/models", True),
    ("/srv/models-old/m", "/srv/models", False),
    ("/srv/models", "gs://srv/models", False),
])
def test_roots_match_on_path_segments(location, root, inside):
    assert artifacts.inside_root(location, root) is inside


def test_a_uri_beside_a_root_is_refused_before_anything_is_read(tmp_path):
    with pytest.raises(ApiError) as err:
        artifacts.resolve("gs://stage-evil/m/0001", ["gs://stage"], tmp_path)
    assert err.value.status == "PERMISSION_DENIED" and "outside the allowed roots" in err.value.message
    with pytest.raises(ApiError) as err:
        artifacts.resolve(str(tmp_path / "models-evil"), [str(tmp_path / "models")], tmp_path)
    assert err.value.status == "PERMISSION_DENIED"


def test_the_platform_refuses_a_bucket_named_like_its_root(platform):
    """The session platform accepts gs://modelyard-staging; a bucket whose name merely starts so is outside."""
    r = requests.post(f"{platform.url}/v1/{PARENT}/models:upload", timeout=30, json={
        "model": {"displayName": "evil", "artifactUri": f"gs://{STAGING_BUCKET}-evil/m/0001"}})
    assert "outside the allowed roots" in google_error(r, 403, "PERMISSION_DENIED")


def test_remote_roots_need_their_bucket(gcs_emulator):
    assert artifacts.check_remote_buckets([f"gs://{STAGING_BUCKET}/models"]) == []
    with pytest.raises(ValueError, match="no bucket gs://no-such-bucket-43"):
        artifacts.check_remote_buckets(["gs://no-such-bucket-43/models"])
    # The platform's own storage starts with it: its missing buckets are said, not fatal.
    (note,) = artifacts.check_remote_buckets(["gs://no-such-bucket-43"], own_storage=gcs_emulator["host"])
    assert "does not exist yet" in note


def test_a_platform_on_a_storage_without_its_root_bucket_does_not_start(tmp_path, gcs_emulator):
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "modelyard.platform", "--port", str(port), "--store", str(tmp_path / "p.db"),
         "--state-dir", str(tmp_path / "state"), "--artifact-root", "gs://no-such-bucket-43/models"],
        env=_env(STORAGE_EMULATOR_HOST=gcs_emulator["host"]), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "--artifact-root gs://no-such-bucket-43/models: no bucket gs://no-such-bucket-43" in proc.stderr
