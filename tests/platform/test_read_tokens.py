"""Issue 43: replicas and batch workers on Ray nodes get a read-only storage token derived from their
starter's (``modelyard.read_tokens``), never the platform's own. One layer down: the token's rules
(derived from the platform's token or a live job token; reads of its buckets only; nowhere else;
forged, widened or outlived tokens refused) and what the Ray runtime environments carry. End to end:
the guarded platform's storage process reads with it and refuses its writes, its API refuses it."""
from __future__ import annotations

import json

import pytest
import requests

from modelyard import read_tokens
from modelyard.platform.api import bearer, job_tokens, read_grants
from modelyard.platform.api.errors import ApiError, check_bearer
from tests.platform.conftest import PARENT, TOKEN

ADMIN = "admin-secret"
JOB = "projects/proj/locations/us-central1/customJobs/7"


def bearer_of(token: str) -> str:
    return f"Bearer {token}"


@pytest.fixture()
def live_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(job_tokens.DIR_ENV, str(tmp_path / "job-tokens"))
    return tmp_path / "job-tokens"


# ---- the token's rules ----------------------------------------------------------------------------
def test_a_token_derived_from_the_platforms_reads_its_buckets_only():
    token = read_tokens.attenuate(ADMIN, ["models", "models"])
    assert ADMIN not in token and token.startswith(read_tokens.PREFIX)
    grant = read_grants.grant(ADMIN, bearer_of(token))
    assert grant is not None and grant.buckets == {"models"}
    for method, path in [("GET", "/storage/v1/b/models/o/a%2Fb"), ("GET", "/download/storage/v1/b/models/o/a%2Fb"),
                         ("HEAD", "/download/storage/v1/b/models/o/x"), ("GET", "/storage/v1/b/models/o"),
                         ("GET", "/storage/v1/b/models")]:
        assert read_grants.may_read(grant, method, path), (method, path)
    for method, path in [("POST", "/upload/storage/v1/b/models/o"), ("DELETE", "/storage/v1/b/models/o/x"),
                         ("PATCH", "/storage/v1/b/models/o/x"), ("POST", "/storage/v1/b/models/o/x/rewriteTo/b/models/o/y"),
                         ("GET", "/storage/v1/b/other/o/x"), ("GET", "/download/storage/v1/b/other/o/x"),
                         ("GET", "/storage/v1/b"), ("GET", "/storage/v1/b/models/iam"), ("POST", "/batch/storage/v1"),
                         ("DELETE", "/storage/v1/b/models")]:
        assert not read_grants.may_read(grant, method, path), (method, path)
    # nowhere but the storage: the control API, the predict front and the console refuse it
    assert bearer.refusal(ADMIN, bearer_of(token)) == bearer.INVALID
    with pytest.raises(ApiError) as caught:
        check_bearer(ADMIN, bearer_of(token), "local")
    assert caught.value.status == "UNAUTHENTICATED"


def test_forged_widened_or_foreign_read_tokens_are_refused():
    token = read_tokens.attenuate(ADMIN, ["models"])
    assert read_grants.grant("another-platform", bearer_of(token)) is None
    payload, _, signature = token[len(read_tokens.PREFIX):].partition(".")
    doc = json.loads(read_tokens.base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    wider = read_tokens._b64(json.dumps({**doc, "buckets": ["models", "secrets"]}).encode())
    assert read_grants.grant(ADMIN, bearer_of(f"{read_tokens.PREFIX}{wider}.{signature}")) is None
    assert read_grants.grant(ADMIN, bearer_of(token[:-3] + "AAA")) is None
    assert read_grants.grant(ADMIN, bearer_of(read_tokens.PREFIX + "garbage")) is None
    assert read_grants.grant(None, bearer_of(token)) is None and read_grants.grant(ADMIN, None) is None
    with pytest.raises(ValueError):
        read_tokens.attenuate(token, ["secrets"])  # a read token is not derived again


def test_a_token_derived_from_a_jobs_lives_as_long_as_the_jobs(live_dir):
    job_token = job_tokens.mint(ADMIN, JOB, "proj")
    job_tokens.activate(job_token, JOB)
    token = read_tokens.attenuate(job_token, ["inputs"])
    assert job_token.rsplit(".", 1)[1] not in token  # the job token's secret part is not in it
    assert read_grants.grant(ADMIN, bearer_of(token)).buckets == {"inputs"}
    job_tokens.revoke(JOB)
    assert read_grants.grant(ADMIN, bearer_of(token)) is None


# ---- what the Ray runtime environments carry ------------------------------------------------------
def test_ray_replicas_get_a_read_token_for_the_artifact_store_never_the_platforms(monkeypatch):
    from modelyard.platform.dataplane import artifact_cache, replicas_ray

    monkeypatch.setattr(replicas_ray.os, "environ", {"MODELYARD_STORAGE_TOKEN": ADMIN, "MODELYARD_PLATFORM_TOKEN": ADMIN,
                                                     "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"})
    env = replicas_ray._storage_env()
    assert ADMIN not in json.dumps(env) and env["STORAGE_EMULATOR_HOST"] == "http://127.0.0.1:9"
    grant = read_grants.grant(ADMIN, bearer_of(env["MODELYARD_STORAGE_TOKEN"]))
    assert grant is not None and grant.buckets == {artifact_cache.DEFAULT_STORE[len("gs://"):]}
    assert replicas_ray.replica_token(ADMIN, "gs://mine/prefix/x") and \
        read_tokens.parse(replicas_ray.replica_token(ADMIN, "gs://mine/prefix/x")).buckets == {"mine"}
    assert replicas_ray.replica_token(ADMIN, "s3://mine") is None and replicas_ray.replica_token(None, "gs://m") is None


def test_batch_workers_get_a_read_token_for_their_inputs_buckets(monkeypatch):
    from modelyard.batch import engine_ray
    from modelyard.batch.spec import InputFile, JobSpec

    monkeypatch.setattr(engine_ray.os, "environ", {"MODELYARD_STORAGE_TOKEN": ADMIN,
                                                   "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"})
    spec = JobSpec("m", 1, "/m/1", (InputFile("gs://in/a.jsonl", 1, 1), InputFile("gs://in2/b.jsonl", 1, 1),
                                    InputFile("/local/c.jsonl", 1, 1)))
    assert engine_ray.readable_buckets(spec) == ["in", "in2"]
    env = engine_ray.storage_runtime_env(engine_ray.readable_buckets(spec))["env_vars"]
    assert ADMIN not in json.dumps(env)
    assert read_grants.grant(ADMIN, bearer_of(env["MODELYARD_STORAGE_TOKEN"])).buckets == {"in", "in2"}
    assert "MODELYARD_STORAGE_TOKEN" not in engine_ray.storage_runtime_env([])["env_vars"]  # reads no bucket
    file_list = JobSpec("m", 1, "/m/1", (InputFile("gs://in/list.txt", 1, 1),), format="file-list")
    assert engine_ray.readable_buckets(file_list) == ["*"]  # its entries may name any bucket
    grant = read_grants.grant(ADMIN, bearer_of(engine_ray.storage_runtime_env(["*"])["env_vars"]["MODELYARD_STORAGE_TOKEN"]))
    assert read_grants.may_read(grant, "GET", "/download/storage/v1/b/anywhere/o/x")
    assert not read_grants.may_read(grant, "POST", "/upload/storage/v1/b/anywhere/o")


# ---- end to end: the storage process and the API of a platform behind --auth-token ----------------
def test_the_storage_reads_with_a_read_token_and_refuses_its_writes(guarded):
    p, _root = guarded
    admin = {"Authorization": bearer_of(TOKEN)}
    for bucket in ("ro-models", "ro-other"):
        r = requests.post(f"{p.storage_url}/storage/v1/b?project=local", json={"name": bucket}, headers=admin, timeout=10)
        assert r.status_code in (200, 409), r.text
        r = requests.post(f"{p.storage_url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name=m.bin", data=b"model",
                          headers=admin, timeout=10)
        assert r.status_code == 200, r.text
    ro = {"Authorization": bearer_of(read_tokens.attenuate(TOKEN, ["ro-models"]))}
    assert requests.get(f"{p.storage_url}/download/storage/v1/b/ro-models/o/m.bin?alt=media", headers=ro,
                        timeout=10).content == b"model"
    assert [o["name"] for o in requests.get(f"{p.storage_url}/storage/v1/b/ro-models/o", headers=ro,
                                            timeout=10).json()["items"]] == ["m.bin"]
    for method, url, body in [
            ("POST", f"{p.storage_url}/upload/storage/v1/b/ro-models/o?uploadType=media&name=evil.bin", b"x"),
            ("DELETE", f"{p.storage_url}/storage/v1/b/ro-models/o/m.bin", None),
            ("GET", f"{p.storage_url}/download/storage/v1/b/ro-other/o/m.bin?alt=media", None)]:
        r = requests.request(method, url, data=body, headers=ro, timeout=10)
        assert r.status_code == 403 and r.json()["error"]["errors"][0]["reason"] == "forbidden", (method, url, r.text)
    assert requests.get(f"{p.storage_url}/storage/v1/b/ro-models/o/m.bin", headers=admin, timeout=10).status_code == 200
    r = requests.get(f"{p.url}/v1/{PARENT}/models", headers=ro, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED", r.text
