"""The platform's Cloud Storage (modelyard.platform.storage) through the real clients: google-cloud-storage
and gcsfs against the session platform's own storage port; the token check on the guarded platform;
an upload cut off half-way; bad names in Google's error format. Name rules are tested one layer down."""
from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from modelyard.platform.storage import StorageApiError, local_file
from modelyard.platform.storage.names import check_object, object_path
from tests.platform.conftest import TOKEN, _env, require, start_platform

BUCKET = "storage-api-test"


@pytest.fixture
def gcs(platform, gcs_emulator, monkeypatch):
    """A google-cloud-storage client of the platform's own storage, and gcsfs pointed at it too."""
    storage = require("google.cloud.storage", "pip install -e '.[test]'")
    import google.auth.credentials

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", platform.storage_url)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    client = storage.Client(project="local", credentials=google.auth.credentials.AnonymousCredentials())
    if client.lookup_bucket(BUCKET) is None:
        client.create_bucket(BUCKET)
    return client


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _google_error(resp: requests.Response, code: int, reason: str) -> str:
    body = resp.json()
    assert resp.status_code == code, resp.text
    assert body["error"]["code"] == code and body["error"]["errors"][0]["reason"] == reason, body
    return body["error"]["message"]


def test_platform_prints_the_export_line(platform):
    # (that jobs get the same value: tests/platform/test_training_pipelines.py reads a job's environment)
    log = (platform.workdir / f"platform-{platform.starts}.log").read_text()
    assert f"export STORAGE_EMULATOR_HOST={platform.storage_url}" in log


def test_resumable_upload_of_100_mb_and_ranged_download(gcs, gcs_emulator, platform, tmp_path):
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(100):
            f.write(os.urandom(1 << 20))
    blob = gcs.bucket(BUCKET).blob("big/model.bin")
    blob.chunk_size = 16 << 20  # several PUTs with Content-Range, each answered 308 until the last
    blob.upload_from_filename(str(src), checksum="crc32c")
    assert blob.size == 100 << 20 and blob.crc32c
    # The object is a plain file under the storage root, byte for byte.
    on_disk = gcs_emulator["root"] / BUCKET / "big" / "model.bin"
    assert _sha(on_disk) == _sha(src)
    assert local_file(f"gs://{BUCKET}/big/model.bin", gcs_emulator["root"]) == on_disk
    back = tmp_path / "back.bin"
    gcs.bucket(BUCKET).blob("big/model.bin").download_to_filename(str(back), checksum="crc32c")
    assert _sha(back) == _sha(src)
    with open(src, "rb") as f:
        f.seek(12345)
        want = f.read(1000)
    got = gcs.bucket(BUCKET).blob("big/model.bin").download_as_bytes(start=12345, end=12345 + 999)
    assert got == want
    url = f"{platform.storage_url}/download/storage/v1/b/{BUCKET}/o/big%2Fmodel.bin?alt=media"
    tail = requests.get(url, headers={"Range": "bytes=-10"})
    assert tail.status_code == 206 and tail.content == src.read_bytes()[-10:]
    assert tail.headers["Content-Range"] == f"bytes {(100 << 20) - 10}-{(100 << 20) - 1}/{100 << 20}"
    _google_error(requests.get(url, headers={"Range": f"bytes={200 << 20}-"}), 416, "requestedRangeNotSatisfiable")
    # MD5 is computed after the upload, once the server is idle; then the metadata carries it.
    import base64

    want_md5 = base64.b64encode(hashlib.md5(src.read_bytes()).digest()).decode()
    deadline = time.monotonic() + 60
    while blob.md5_hash is None and time.monotonic() < deadline:
        time.sleep(1)
        blob.reload()
    assert blob.md5_hash == want_md5


def test_list_with_delimiter_and_pages(gcs):
    bucket = gcs.bucket(BUCKET)
    names = ["list/a.txt", "list/b/1", "list/b/2", "list/c/x/y", "list/d.txt", "list/b-side"]
    for n in names:
        bucket.blob(n).upload_from_string(n.encode())
    it = gcs.list_blobs(BUCKET, prefix="list/", delimiter="/")
    assert [b.name for b in it] == ["list/a.txt", "list/b-side", "list/d.txt"]
    assert it.prefixes == {"list/b/", "list/c/"}
    pages = list(gcs.list_blobs(BUCKET, prefix="list/", page_size=2).pages)
    assert len(pages) == 3
    assert [b.name for p in pages for b in p] == sorted(names)  # Cloud Storage's order: "b-side" < "b/1"
    delimited = list(gcs.list_blobs(BUCKET, prefix="list/", delimiter="/", page_size=1).pages)
    assert sum(len(list(p)) + len(p.prefixes) for p in delimited) == 5


def test_rewrite_copy_compose_and_preconditions(gcs):
    from google.api_core.exceptions import PreconditionFailed

    bucket = gcs.bucket(BUCKET)
    src = bucket.blob("rw/src")
    src.upload_from_string(b"0123456789", content_type="text/plain")
    dest = bucket.blob("rw/dest")
    token, done, total = dest.rewrite(src)
    assert token is None and done == total == 10
    assert dest.download_as_bytes() == b"0123456789" and dest.content_type == "text/plain"
    bucket.copy_blob(src, bucket, "rw/copy")
    both = bucket.blob("rw/both")
    both.compose([src, bucket.blob("rw/copy")])
    assert both.download_as_bytes() == b"01234567890123456789"
    with pytest.raises(PreconditionFailed):
        bucket.blob("rw/src").upload_from_string(b"again", if_generation_match=0)
    src.reload()
    bucket.blob("rw/src").upload_from_string(b"new", if_generation_match=src.generation)
    assert bucket.blob("rw/src").download_as_bytes() == b"new"


def test_the_sdks_staging_code_creates_a_bucket_and_grants_it(gcs, tmp_path):
    """google-cloud-aiplatform's own staging helpers: bucket exists/create, getIamPolicy/setIamPolicy, upload."""
    require("google.cloud.aiplatform", "pip install -e '.[test]'")
    import google.auth.credentials
    from google.cloud.aiplatform.utils import gcs_utils

    anon = google.auth.credentials.AnonymousCredentials()
    uri = gcs_utils.create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist(
        output_artifacts_gcs_dir="gs://sdk-pipelines-bucket/root", service_account="runner@local.iam.gserviceaccount.com",
        project="local", location="us-central1", credentials=anon)
    assert uri == "gs://sdk-pipelines-bucket/root"
    policy = gcs.bucket("sdk-pipelines-bucket").get_iam_policy()
    assert "serviceAccount:runner@local.iam.gserviceaccount.com" in policy["roles/storage.objectCreator"]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "saved_model.pb").write_bytes(b"pb")
    staged = gcs_utils.stage_local_data_in_gcs(str(tmp_path / "model"), staging_gcs_dir=f"gs://{BUCKET}/staging",
                                               project="local", location="us-central1", credentials=anon)
    name = staged.split(f"gs://{BUCKET}/", 1)[1] + "/saved_model.pb"
    assert gcs.bucket(BUCKET).blob(name).download_as_bytes() == b"pb"


def test_gcsfs_reads_a_model_directory(gcs, tiny_models, tmp_path):
    gcsfs = require("gcsfs", "pip install gcsfs")
    model = Path(tiny_models["models"]["tiny1"]["path"])
    files = sorted(p for p in model.rglob("*") if p.is_file())
    for p in files:  # as aiplatform's upload_directory does, one blob per file
        gcs.bucket(BUCKET).blob(f"models/tiny1/{p.relative_to(model).as_posix()}").upload_from_filename(str(p))
    fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=os.environ["STORAGE_EMULATOR_HOST"])
    found = sorted(fs.find(f"{BUCKET}/models/tiny1"))
    assert found == [f"{BUCKET}/models/tiny1/{p.relative_to(model).as_posix()}" for p in files]
    fs.get(f"{BUCKET}/models/tiny1", str(tmp_path / "copy"), recursive=True)
    for p in files:
        assert (tmp_path / "copy" / p.relative_to(model)).read_bytes() == p.read_bytes()
    with fs.open(f"{BUCKET}/models/tiny1/{files[0].relative_to(model).as_posix()}", "rb") as f:
        f.seek(1)
        assert f.read(5) == files[0].read_bytes()[1:6]
    # gcsfs's own writes (multipart bodies with bare LF, resumable for large files) and batch deletes
    fs.pipe(f"{BUCKET}/gcsfs/small", b"small")
    fs.put(str(files[0]), f"{BUCKET}/gcsfs/copied")
    with fs.open(f"{BUCKET}/gcsfs/large", "wb", block_size=5 << 20) as f:
        f.write(b"x" * (12 << 20))
    assert fs.cat(f"{BUCKET}/gcsfs/small") == b"small" and fs.info(f"{BUCKET}/gcsfs/large")["size"] == 12 << 20
    assert fs.cat(f"{BUCKET}/gcsfs/copied") == files[0].read_bytes()
    fs.mv(f"{BUCKET}/gcsfs/small", f"{BUCKET}/gcsfs/moved")  # moveTo: a rename
    assert fs.cat(f"{BUCKET}/gcsfs/moved") == b"small" and not fs.exists(f"{BUCKET}/gcsfs/small")
    fs.rm([f"{BUCKET}/gcsfs/moved", f"{BUCKET}/gcsfs/copied", f"{BUCKET}/gcsfs/large"])
    assert fs.find(f"{BUCKET}/gcsfs") == []
    fs.mkdir("gcsfs-made-bucket")  # buckets: create, refuse to delete while not empty, delete
    fs.pipe("gcsfs-made-bucket/x", b"x")
    from gcsfs.retry import HttpError

    with pytest.raises(HttpError, match="not empty"):
        fs.rmdir("gcsfs-made-bucket")
    fs.rm("gcsfs-made-bucket/x")
    fs.rmdir("gcsfs-made-bucket")
    assert "gcsfs-made-bucket" not in [b.name for b in gcs.list_buckets()]


def test_bad_input_gets_googles_error_format(gcs, platform):
    from google.api_core.exceptions import BadRequest, NotFound

    base = f"{platform.storage_url}/storage/v1/b"
    assert "bucket does not exist" in _google_error(requests.get(f"{base}/no-such-bucket/o"), 404, "notFound")
    with pytest.raises(NotFound):
        gcs.get_bucket("no-such-bucket")
    for bad in ("..%2F..%2Fetc%2Fpasswd", "%2e%2e%2Fx", "a%2F%2Fb", "%2Fabsolute", "a%2F.%2Fb"):
        _google_error(requests.get(f"{base}/{BUCKET}/o/{bad}"), 400, "invalid")
        upload = f"{platform.storage_url}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={bad}"
        _google_error(requests.post(upload, data=b"x"), 400, "invalid")
    with pytest.raises(BadRequest):
        gcs.bucket(BUCKET).blob("../escape").upload_from_string(b"x")
    _google_error(requests.post(base, json={"name": "Bad_Bucket!"}), 400, "invalid")
    _google_error(requests.get(f"{base}/{BUCKET}/o/missing"), 404, "notFound")
    _google_error(requests.get(f"{base}/{BUCKET}/o", params={"pageToken": "%%%"}), 400, "invalid")
    # ... and it keeps serving
    assert requests.get(f"{base}/{BUCKET}").json()["name"] == BUCKET


def test_a_wrong_checksum_is_refused_and_leaves_nothing(gcs, platform):
    body = (b'--xx\r\nContent-Type: application/json\r\n\r\n{"name": "sum/bad", "crc32c": "AAAAAA=="}\r\n'
            b"--xx\r\nContent-Type: text/plain\r\n\r\nhello\r\n--xx--\r\n")
    r = requests.post(f"{platform.storage_url}/upload/storage/v1/b/{BUCKET}/o?uploadType=multipart", data=body,
                      headers={"Content-Type": "multipart/related; boundary=xx"})
    assert "CRC32C" in _google_error(r, 400, "invalid")
    assert not gcs.bucket(BUCKET).blob("sum/bad").exists()
    good = body.replace(b', "crc32c": "AAAAAA=="', b"")
    r = requests.post(f"{platform.storage_url}/upload/storage/v1/b/{BUCKET}/o?uploadType=multipart", data=good,
                      headers={"Content-Type": "multipart/related; boundary=xx"})
    assert r.status_code == 200 and gcs.bucket(BUCKET).blob("sum/bad").download_as_bytes() == b"hello"


def test_an_upload_cut_off_half_way_leaves_nothing(gcs, gcs_emulator, platform):
    host, port = "127.0.0.1", platform.storage_port
    for kind in ("media", "multipart"):
        name = f"cut/{kind}.bin"
        head = (f"POST /upload/storage/v1/b/{BUCKET}/o?uploadType={kind}&name={name} HTTP/1.1\r\n"
                f"Host: {host}:{port}\r\nContent-Length: {20 << 20}\r\n")
        head += ("Content-Type: multipart/related; boundary=xx\r\n\r\n--xx\r\nContent-Type: application/json\r\n\r\n"
                 f'{{"name": "{name}"}}\r\n--xx\r\nContent-Type: application/octet-stream\r\n\r\n'
                 if kind == "multipart" else "Content-Type: application/octet-stream\r\n\r\n")
        temp = gcs_emulator["root"] / ".modelyard" / "tmp"
        # Other tests' resumable sessions keep their bytes here by design (for the client's retry): only a
        # file this upload made counts.
        before = set(temp.iterdir()) if temp.is_dir() else set()
        with socket.create_connection((host, port)) as s:
            s.sendall(head.encode())
            s.sendall(os.urandom(8 << 20))  # then the client dies
        deadline = time.monotonic() + 10
        while set(temp.iterdir()) - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not set(temp.iterdir()) - before
        assert not gcs.bucket(BUCKET).blob(name).exists()
        assert not (gcs_emulator["root"] / BUCKET / name).exists()
    # a resumable session that never finishes leaves no object either
    blob = gcs.bucket(BUCKET).blob("cut/resumable.bin")
    url = blob.create_resumable_upload_session(size=10 << 20)
    r = requests.put(url, data=os.urandom(4 << 20), headers={"Content-Range": f"bytes 0-{(4 << 20) - 1}/{10 << 20}"})
    assert r.status_code == 308 and r.headers["Range"] == f"bytes=0-{(4 << 20) - 1}"
    assert not blob.exists()


def test_auth_token_refuses_anonymous_calls(guarded, monkeypatch):
    storage = require("google.cloud.storage", "pip install -e '.[test]'")
    import google.auth.credentials
    import google.oauth2.credentials
    from google.auth.exceptions import InvalidOperation

    p, _root = guarded
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", p.storage_url)
    _google_error(requests.get(f"{p.storage_url}/storage/v1/b"), 401, "required")
    _google_error(requests.get(f"{p.storage_url}/storage/v1/b", headers={"Authorization": "Bearer wrong"}), 401,
                  "authError")
    anon = storage.Client(project="local", credentials=google.auth.credentials.AnonymousCredentials())
    # google-auth answers a 401 by refreshing the credentials, which anonymous ones cannot: that is the refusal.
    with pytest.raises(InvalidOperation):
        anon.create_bucket("guarded-bucket")
    client = storage.Client(project="local", credentials=google.oauth2.credentials.Credentials(TOKEN))
    bucket = client.create_bucket("guarded-bucket")
    bucket.blob("x").upload_from_string(b"secret")
    assert bucket.blob("x").download_as_bytes() == b"secret"
    with pytest.raises(InvalidOperation):
        anon.bucket("guarded-bucket").blob("x").download_as_bytes()


def test_a_crashed_storage_process_is_started_again(platform, gcs):
    from tests.platform.conftest import live_processes

    marker = f"--port\0{platform.storage_port}\0".encode()
    pids = [pid for pid, cmd, _ in live_processes() if b"modelyard.platform.storage" in cmd and marker in cmd]
    assert len(pids) == 1, pids
    os.kill(pids[0], 9)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{platform.storage_url}/storage/v1/b/{BUCKET}", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.2)
    assert gcs.bucket(BUCKET).exists()  # back, with its objects (they are files)
    assert "starting it again" in (platform.workdir / f"platform-{platform.starts}.log").read_text()


def test_a_platform_given_storage_uses_it(tmp_path_factory, gcs_emulator):
    p = start_platform(tmp_path_factory, "outside-storage", _env(STORAGE_EMULATOR_HOST=gcs_emulator["host"]),
                       ["--no-warm-spare"])
    try:
        log = (p.workdir / "platform-1.log").read_text()
        assert f"using the Cloud Storage at STORAGE_EMULATOR_HOST={gcs_emulator['host']}" in log
        with pytest.raises(requests.ConnectionError):
            requests.get(p.storage_url + "/storage/v1/b", timeout=2)
    finally:
        p.cleanup()


# ---- one layer down: the name rules and the path mapping ---------------------------------------------

@pytest.mark.parametrize("name", ["..", "../x", "a/../../b", "a//b", "/abs", "a/./b", ".", "a\0b", "x\ny", "",
                                  "a/" + "z" * 256])
def test_names_that_cannot_be_files_are_refused(name):
    with pytest.raises(StorageApiError) as err:
        check_object(name)
    assert err.value.code == 400 and err.value.reason == "invalid"


def test_names_map_under_the_root_and_symlinks_cannot_leave_it(tmp_path):
    root = tmp_path / "root"
    (root / "bkt").mkdir(parents=True)
    assert object_path(root, "bkt", "a/b c/é.txt") == root / "bkt" / "a" / "b c" / "é.txt"
    assert object_path(root, "bkt", "dir/") == root / "bkt" / "dir"
    assert local_file("/gcs/bkt/x/y", root) == root / "bkt" / "x" / "y"
    assert local_file("gs://bkt", root) == root / "bkt"
    assert local_file("gs://bkt/x", None) is None
    (tmp_path / "outside").mkdir()
    (root / "bkt" / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(StorageApiError):
        object_path(root, "bkt", "link/secret")
    with pytest.raises(StorageApiError):
        local_file("gs://Bad_Bucket/x", root)


def test_storage_speaks_tls_when_the_platform_does(tmp_path, monkeypatch):
    """The platform's --tls-cert/--tls-key serve its storage port too; a stock client trusting the CA works."""
    storage = require("google.cloud.storage", "pip install -e '.[test]'")
    import google.auth.credentials

    from modelyard.ports import free_port
    from tests.platform.test_tls import _wait_tls, _write_server_files
    from tests.serving.security.pki import make_pki

    pki = make_pki(tmp_path)
    _write_server_files(tmp_path, pki)
    port, storage_port = free_port(), free_port()
    log = tmp_path / "platform.log"
    proc = subprocess.Popen([sys.executable, "-m", "modelyard.platform", "--port", str(port), "--store",
                             str(tmp_path / "p.db"), "--state-dir", str(tmp_path / "state"), "--no-warm-spare",
                             "--storage-port", str(storage_port), "--tls-cert", str(tmp_path / "server.pem"),
                             "--tls-key", str(tmp_path / "server.key")],
                            env=_env(), stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        _wait_tls(port, proc, log, verify=pki.ca_file)
        url = f"https://127.0.0.1:{storage_port}"
        assert f"export STORAGE_EMULATOR_HOST={url}" in log.read_text()
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(pki.ca_file))
        client = storage.Client(project="local", credentials=google.auth.credentials.AnonymousCredentials())
        client.create_bucket("tls-bucket").blob("a").upload_from_string(b"over tls")
        assert client.bucket("tls-bucket").blob("a").download_as_bytes() == b"over tls"
        with pytest.raises(requests.exceptions.ConnectionError):  # plaintext to the TLS port
            requests.get(f"http://127.0.0.1:{storage_port}/storage/v1/b", timeout=10)
    finally:
        proc.terminate()
        proc.wait(30)
