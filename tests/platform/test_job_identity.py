"""Issue 44, must-show 3: a job finds its project and credentials, as on Vertex AI (jobs/job_identity).

End to end, behind ``--auth-token`` (the ``guarded`` platform): inside a CustomJob, Google's
``test_project_id_inference`` script as written (``aiplatform.initializer.global_config.project`` with no
``init``), then ``aiplatform.init()`` with no arguments and a list call, ``google.auth.default()`` and
``storage.Client().list_blobs(...)``; the job's token is its own (not the platform's, which is nowhere
in its environment) and stops working when the job ends. The token rules, the metadata answers and the
SDK defaults are tested one layer down, without a process.
"""
from __future__ import annotations

import json
import sys
import time
import types

import pytest
import requests

from modelyard import read_tokens
from modelyard.platform.api import bearer, job_tokens
from modelyard.platform.api.errors import ApiError, check_bearer
from modelyard.platform.jobs import job_identity, metadata_server, sdk_defaults
from tests.platform.conftest import TOKEN, require

ADMIN = "admin-secret"
JOB = "projects/proj/locations/us-central1/customJobs/7"


@pytest.fixture()
def live_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(job_tokens.DIR_ENV, str(tmp_path / "job-tokens"))
    return tmp_path / "job-tokens"


# ---- one layer down -------------------------------------------------------------------------------
def test_a_job_token_is_live_from_its_start_to_its_end(live_dir):
    token = job_identity.issue_token(ADMIN, JOB)
    assert token.startswith(job_tokens.PREFIX) and ADMIN not in token
    header = f"Bearer {token}"
    assert bearer.refusal(ADMIN, header) is None  # the storage's rule: a live job token passes
    assert bearer.job_grant(ADMIN, header) == job_tokens.Grant(JOB, "proj")
    assert bearer.refusal("another-platform", header) == bearer.INVALID  # signed with another platform's token
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    assert bearer.refusal(ADMIN, f"Bearer {forged}") == bearer.INVALID
    assert job_identity.end_tokens(JOB) == 1
    assert bearer.refusal(ADMIN, header) == bearer.INVALID and bearer.job_grant(ADMIN, header) is None
    assert bearer.refusal(ADMIN, f"Bearer {ADMIN}") is None and bearer.refusal(ADMIN, None) == bearer.MISSING


def test_no_job_token_without_auth_token_or_a_live_directory(live_dir, monkeypatch):
    assert job_identity.issue_token(None, JOB) is None
    monkeypatch.delenv(job_tokens.DIR_ENV)
    assert job_identity.issue_token(ADMIN, JOB) is None
    token = job_tokens.mint(ADMIN, JOB, "proj")  # signed, but marked live nowhere
    assert bearer.refusal(ADMIN, f"Bearer {token}") == bearer.INVALID


def test_the_api_takes_a_job_token_for_its_own_project_only(live_dir):
    header = f"Bearer {job_identity.issue_token(ADMIN, JOB)}"
    check_bearer(ADMIN, header, "proj")
    for project in ("other", None):  # another project; a path of no project (console, replicas, metrics)
        with pytest.raises(ApiError) as err:
            check_bearer(ADMIN, header, project)
        assert err.value.status == "PERMISSION_DENIED" and JOB in str(err.value)
    check_bearer(ADMIN, f"Bearer {ADMIN}", None)  # the platform's token: everything
    job_identity.end_tokens(JOB)
    with pytest.raises(ApiError) as err:
        check_bearer(ADMIN, header, "proj")
    assert err.value.status == "UNAUTHENTICATED"


def test_project_of_a_request_path():
    assert bearer.project_of("projects/p1/locations/l/customJobs") == "p1"
    assert bearer.project_of("/v1/projects/p2/locations/l/models/3:undeploy") == "p2"
    assert bearer.project_of("/ui/projects/p3/locations/l/operations/9") == "p3"
    assert bearer.project_of("/modelyard/v1/replicas") is None and bearer.project_of("") is None


def test_the_platforms_token_never_reaches_a_job():
    env = job_identity.without_admin_token({"MODELYARD_STORAGE_TOKEN": ADMIN, "MODELYARD_PLATFORM_TOKEN": ADMIN,
                                            "PATH": "/bin"}, "job-token")
    assert env == {"PATH": "/bin", "MODELYARD_STORAGE_TOKEN": "job-token"}
    assert job_identity.without_admin_token({"MODELYARD_PLATFORM_TOKEN": ADMIN}) == {}


def test_metadata_answers_as_compute_engine():
    flavor = {"Metadata-Flavor": "Google"}
    email = metadata_server.service_account("proj")

    def ask(path, headers=flavor, **query):
        return metadata_server.answer(path, query, headers, "proj", email, "job-token")

    assert ask("/", {}) == (403, 'Missing required header "Metadata-Flavor": "Google"')
    assert ask("/") == (200, "computeMetadata/\n")  # google-auth's ping
    assert ask("/computeMetadata/v1/project/project-id") == (200, "proj")
    assert ask("/computeMetadata/v1/instance/service-accounts/default/", recursive="true") == (
        200, {"aliases": ["default"], "email": email, "scopes": metadata_server.SCOPES})
    status, token = ask(f"/computeMetadata/v1/instance/service-accounts/{email}/token", scopes="a,b")
    assert status == 200 and token["access_token"] == "job-token" and token["token_type"] == "Bearer"
    assert ask("/computeMetadata/v1/instance/service-accounts/default/email") == (200, email)
    assert ask("/computeMetadata/v1/universe/universe-domain") == (200, "googleapis.com")
    assert ask("/computeMetadata/v1/instance/attributes/nothing")[0] == 404
    assert ask("/computeMetadata/v1/project/project-id", {**flavor, "X-Forwarded-For": "1.2.3.4"})[0] == 403
    assert metadata_server.answer("/computeMetadata/v1/instance/service-accounts/default/token", {}, flavor,
                                  "proj", email, None)[1]["access_token"] == metadata_server.NO_AUTH_TOKEN


def test_sdk_defaults_fill_only_what_init_left_unset(monkeypatch):
    monkeypatch.setenv("MODELYARD_PLATFORM", "http://127.0.0.1:8600")
    monkeypatch.setenv("CLOUD_ML_PROJECT_ID", "proj")
    config = types.SimpleNamespace(_api_endpoint=None, _api_transport=None, _project=None)
    sdk_defaults.apply(config)
    assert (config._api_endpoint, config._api_transport, config._project) == ("http://127.0.0.1:8600", "rest", "proj")
    mine = types.SimpleNamespace(_api_endpoint="https://example", _api_transport="grpc", _project="mine")
    sdk_defaults.apply(mine)
    assert (mine._api_endpoint, mine._api_transport, mine._project) == ("https://example", "grpc", "mine")
    monkeypatch.setenv("CLOUD_ML_PROJECT_ID", "123456")  # a project number: the SDK turns it into an id itself
    number = types.SimpleNamespace(_api_endpoint=None, _api_transport=None, _project=None)
    sdk_defaults.apply(number)
    assert number._project is None



def test_sdk_defaults_install_applies_to_an_initializer_already_imported(monkeypatch):
    """A job's process forked from the warm interpreter may have the SDK imported already: install()
    applies the defaults now rather than waiting for an import that will not come."""
    monkeypatch.setenv("MODELYARD_PLATFORM", "http://127.0.0.1:8600")
    monkeypatch.setenv("CLOUD_ML_PROJECT_ID", "proj")
    config = types.SimpleNamespace(_api_endpoint=None, _api_transport=None, _project=None)
    monkeypatch.setitem(sys.modules, sdk_defaults.TARGET, types.SimpleNamespace(global_config=config))
    sdk_defaults.install()
    assert (config._api_endpoint, config._project) == ("http://127.0.0.1:8600", "proj")

# ---- inside a CustomJob, behind --auth-token ---------------------------------------------------------
BUCKET = "identity-staging"
# Google's tests/system/aiplatform/test_project_id_inference.py runs this _SCRIPT in a CustomJob (after
# pip-installing the SDK, which the platform's Python has); the lines after it are this test's.
JOB_SCRIPT = '''
from google.cloud import aiplatform
# Not initializing the Vertex SDK explicitly
# Checking the project ID
print(aiplatform.initializer.global_config.project)
assert not aiplatform.initializer.global_config.project.endswith("-tp")

import json, os
import google.auth
import google.auth.transport.requests
from google.cloud import storage

aiplatform.init()
jobs = [j.resource_name for j in aiplatform.CustomJob.list()]
credentials, project = google.auth.default()
credentials.refresh(google.auth.transport.requests.Request())
client = storage.Client()
blobs = [b.name for b in client.list_blobs("%s", prefix="inputs/")]
with open("/proc/self/environ", "rb") as f:
    started_with = f.read().decode(errors="replace")
report = {"sdk_project": aiplatform.initializer.global_config.project, "project": project, "jobs": jobs,
          "credentials": type(credentials).__name__, "token": credentials.token, "blobs": blobs,
          "environ": dict(os.environ), "started_with": started_with}
client.bucket("%s").blob("outputs/report.json").upload_from_string(json.dumps(report))
''' % (BUCKET, BUCKET)


def test_a_job_finds_its_project_and_credentials_and_its_token_is_its_own(guarded):
    aip = require("google.cloud.aiplatform", "pip install -e '.[test]' (installs google-cloud-aiplatform)")
    import google.oauth2.credentials
    from google.cloud import storage
    from google.cloud.aiplatform import jobs as sdk_jobs

    p, _root = guarded
    admin = {"Authorization": f"Bearer {TOKEN}"}
    assert requests.post(f"{p.storage_url}/storage/v1/b?project=local", json={"name": BUCKET}, headers=admin,
                         timeout=10).status_code in (200, 409)
    assert requests.post(f"{p.storage_url}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=inputs/a.txt",
                         data=b"a", headers=admin, timeout=10).status_code == 200
    credentials = google.oauth2.credentials.Credentials(TOKEN)
    aip.init(project="local", location="us-central1", api_endpoint=p.url, api_transport="rest",
             credentials=credentials, staging_bucket=f"gs://{BUCKET}")
    saved, sdk_jobs._JOB_WAIT_TIME = sdk_jobs._JOB_WAIT_TIME, 0.5
    try:
        job = aip.CustomJob(display_name="identity", worker_pool_specs=[{
            "machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            # Google's command, without its pip install of the SDK from GitHub.
            "container_spec": {"image_uri": "python:3.9", "command": ["sh", "-exc", '"$0" "$@"', "python3", "-c",
                                                                      JOB_SCRIPT], "args": []}}])
        job.run()
    finally:
        sdk_jobs._JOB_WAIT_TIME = saved
    assert job.state.name == "JOB_STATE_SUCCEEDED", requests.get(f"{p.url}/modelyard/v1/jobs/{job.name}/logs",
                                                                 headers=admin, timeout=10).text[-3000:]
    client = storage.Client(project="local", credentials=credentials,
                            client_options={"api_endpoint": p.storage_url})
    report = json.loads(client.bucket(BUCKET).blob("outputs/report.json").download_as_text())

    assert report["sdk_project"] == report["project"] == "local"
    assert job.resource_name in report["jobs"]  # aiplatform.init() with no arguments, then a list call
    assert report["credentials"] == "Credentials" and report["blobs"] == ["inputs/a.txt"]
    token = report["token"]
    assert token.startswith(job_tokens.PREFIX) and token != TOKEN  # its own token, from its metadata server
    assert TOKEN not in json.dumps(report["environ"]) and TOKEN not in report["started_with"]
    assert report["environ"]["GCE_METADATA_HOST"].startswith("127.0.0.1:")

    # The job has ended: its token opens nothing any more; the platform's still does.
    job_auth = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + 10  # the end is recorded when the runner sees the process gone
    while requests.get(f"{p.storage_url}/storage/v1/b/{BUCKET}/o", headers=job_auth, timeout=10).status_code != 401:
        assert time.monotonic() < deadline, "the job's token still opens the storage after the job ended"
        time.sleep(0.1)
    r = requests.get(f"{p.url}/v1/projects/local/locations/us-central1/customJobs", headers=job_auth, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
    assert requests.get(f"{p.storage_url}/storage/v1/b/{BUCKET}/o", headers=admin, timeout=10).status_code == 200


def test_a_jobs_processes_find_its_metadata_server_and_gateway(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "corp.example")
    settings = {"proxy": "http://127.0.0.1:41", "storage": "http://127.0.0.1:42", "ca_bundle": str(tmp_path / "ca.pem")}
    env = job_identity.identity_env(settings, tmp_path)
    assert env["GCE_METADATA_HOST"] == env["GCE_METADATA_IP"] == "127.0.0.1:42"  # google-auth and TensorFlow ask it
    assert env["STORAGE_EMULATOR_HOST"] == "http://127.0.0.1:42" and env["HTTPS_PROXY"] == "http://127.0.0.1:41"
    assert env["CURL_CA_BUNDLE"] == settings["ca_bundle"] and env["CLOUDSDK_CONFIG"] == str(tmp_path / "gcloud")
    assert "NO_GCE_CHECK" not in env and "GOOGLE_AUTH_TOKEN_FOR_TESTING" not in env  # TensorFlow asks the server
    assert env["NO_PROXY"].startswith("corp.example,")


def test_a_ray_jobs_nodes_get_the_jobs_token_never_the_platforms(monkeypatch):
    """--engine ray: what reaches a replica's node (jobs_ray.node_env) holds the job's own token, as the job's
    process does, and the job's Ray runtime environment (replicas_ray._storage_env, read by the job's ray.init)
    a read-only token derived from it; its metadata server on the node is made from them (jobs_ray.JobReplicaActor._identity)."""
    from modelyard.platform.dataplane import replicas_ray
    from modelyard.platform.jobs import jobs_ray

    platform = {"MODELYARD_STORAGE_TOKEN": ADMIN, "MODELYARD_PLATFORM_TOKEN": ADMIN, "PATH": "/bin",
                "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9", "MODELYARD_PLATFORM": "http://127.0.0.1:8"}
    job_process = job_identity.without_admin_token(platform, "job-token")
    replica = {**job_process, "CLOUD_ML_PROJECT_ID": "proj", "TF_CONFIG": "{}"}
    delta, unset = jobs_ray.node_env(replica, job_process)
    assert delta == {"CLOUD_ML_PROJECT_ID": "proj", "TF_CONFIG": "{}", "MODELYARD_STORAGE_TOKEN": "job-token",
                     "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9", "MODELYARD_PLATFORM": "http://127.0.0.1:8"}
    assert unset == []
    monkeypatch.setattr(replicas_ray.os, "environ", job_process)
    # the runtime environment's default: read-only, derived from the job's token (tests/platform/test_read_tokens.py)
    derived = read_tokens.parse(replicas_ray._storage_env()["MODELYARD_STORAGE_TOKEN"])
    assert derived is not None and read_tokens.signed_by("job-token", derived)
    assert ADMIN not in json.dumps([delta, replicas_ray._storage_env()])


def test_only_custom_and_tuning_jobs_on_ray_have_their_identity_served_on_the_nodes():
    """Under --engine ray a custom job's replicas and a tuning job's trials (each a job: trial_job) run on
    Ray nodes (each node serves the job's identity); batch jobs and training pipelines' own processes run
    on the platform's host and get the job's metadata server there, as under --engine local."""
    from modelyard.platform.jobs import job_runner

    ray = {"engine": {"name": "ray", "address": "127.0.0.1:1"}}
    elsewhere = {kind: getattr(job_runner.kind_module(kind), "processes_elsewhere", lambda job: False)
                 for kind in job_runner.MODULES}
    assert elsewhere["customJobs"](ray) and not elsewhere["customJobs"]({"engine": None})
    assert [kind for kind, rule in elsewhere.items() if rule(ray)] == ["customJobs", "hyperparameterTuningJobs"]
