"""Issue 44, must-show 1: TensorFlow's own ``gs://`` reaches the platform's storage (modelyard.tf_gcs).

End to end: the textbook's training script, unchanged, as a CustomTrainingJob through the stock SDK (its
model deploys and predicts; its checkpoints and TensorBoard events are in the bucket, and this process's
own ``tf.io.gfile.glob`` finds them); TensorFlow in a user's process through ``modelyard.tf_gcs.enable``
against a storage behind a token and TLS (checkpoints, BackupAndRestore, summaries, tf.data, SavedModel;
a wrong token refused); ``modelyard train`` with gs:// data, job dir and export against the same storage.
The request mapping, the head cleaning and the variables are tested one layer
down, without a process.
"""
from __future__ import annotations

import json
import os
import ssl
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from modelyard import tf_gcs
from tests.platform.conftest import STAGING_BUCKET, _env
# Not jobs_helpers.no_stray_jobs (autouse: every test here would start the platform); the job test cleans up itself.
from tests.platform.jobs_helpers import aiplatform, job_processes  # noqa: F401
from tests.storage_server import StorageProcess
from tests.warm_process import run_python

BOOK_SCRIPT = str(Path(__file__).with_name("job_scripts") / "book_training_task.py")
TRAIN_IMAGE = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-12.py310:latest"
SERVE_IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-12:latest"


# ---- one layer down -------------------------------------------------------------------------------
def test_google_hosts_map_to_the_storages_own_paths():
    assert tf_gcs.upstream_target("www.googleapis.com", "/storage/v1/b/b/o/a%2Fb?fields=size") == \
        "/storage/v1/b/b/o/a%2Fb?fields=size"
    assert tf_gcs.upstream_target("www.googleapis.com", "/upload/storage/v1/b/b/o?uploadType=resumable&name=x") == \
        "/upload/storage/v1/b/b/o?uploadType=resumable&name=x"
    # TensorFlow's reads: the XML-style object URL, with its Range header passed on unchanged.
    assert tf_gcs.upstream_target("storage.googleapis.com", "/bkt/model/variables/variables.index") == \
        "/download/storage/v1/b/bkt/o/model/variables/variables.index?alt=media"
    assert tf_gcs.upstream_target("storage.googleapis.com:443", "/bkt/a%20b?generation=3") == \
        "/download/storage/v1/b/bkt/o/a%20b?alt=media&generation=3"
    assert tf_gcs.upstream_target("storage.googleapis.com", "/bkt") is None
    assert tf_gcs.upstream_target("127.0.0.1:9", "/storage/v1/b") == "/storage/v1/b"


def test_libcurls_transfer_encoding_beside_content_length_is_cleaned():
    head = (b"PUT /upload/storage/v1/b/b/o?upload_id=1 HTTP/1.1\r\nHost: www.googleapis.com\r\n"
            b"Transfer-Encoding: chunked\r\nContent-Range: bytes 0-4/5\r\nContent-Length: 5\r\n\r\n")
    cleaned, length = tf_gcs.clean_head(head)
    assert length is None and b"Content-Length" not in cleaned and b"Transfer-Encoding: chunked" in cleaned
    head = (b"POST /upload/storage/v1/b/b/o?uploadType=resumable HTTP/1.1\r\nHost: www.googleapis.com\r\n"
            b"Content-Length: 0\r\nTransfer-Encoding: identity\r\n\r\n")
    cleaned, length = tf_gcs.clean_head(head)
    assert length == 0 and b"identity" not in cleaned and cleaned.endswith(b"Content-Length: 0\r\n\r\n")
    assert tf_gcs.clean_head(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0)


def test_forwarded_headers_and_the_gateways_token():
    sent = {"Host": "www.googleapis.com", "Expect": "100-continue", "Connection": "keep-alive", "Range": "bytes=0-9"}
    assert tf_gcs.forward_headers(sent, None) == {"Range": "bytes=0-9"}
    assert tf_gcs.forward_headers(sent, "job-token")["Authorization"] == "Bearer job-token"
    # A client's own credentials are passed on as they are: the storage decides.
    assert tf_gcs.forward_headers({"authorization": "Bearer mine"}, "job-token") == {"authorization": "Bearer mine"}
    assert tf_gcs.rewrite_location("http://127.0.0.1:9/upload/storage/v1/b/b/o?upload_id=1", "http://127.0.0.1:9",
                                   "https://www.googleapis.com") == \
        "https://www.googleapis.com/upload/storage/v1/b/b/o?upload_id=1"


def test_tensorflow_variables():
    settings = {"proxy": "http://127.0.0.1:1", "storage": "http://127.0.0.1:2", "ca_bundle": "/x/ca.pem"}
    env = tf_gcs.tensorflow_env(settings, "tok", {"NO_PROXY": "corp.example"})
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://127.0.0.1:1" and env["CURL_CA_BUNDLE"] == "/x/ca.pem"
    assert env["NO_PROXY"] == "corp.example,127.0.0.1,localhost,::1" and env["GOOGLE_AUTH_TOKEN_FOR_TESTING"] == "tok"
    assert tf_gcs.tensorflow_env(settings, None, {})["NO_GCE_CHECK"] == "true"  # no token: TensorFlow looks for none
    # A job's processes: TensorFlow asks the job's metadata server for its token.
    assert "NO_GCE_CHECK" not in tf_gcs.tensorflow_env(settings, None, {"GCE_METADATA_HOST": "127.0.0.1:3"})


def test_an_environment_routed_to_a_live_gateway_is_not_routed_again():
    """enable() in a platform job (modelyard train there): the job's gateway is used, not a second one."""
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        proxy = f"http://127.0.0.1:{listening.getsockname()[1]}"
        env = tf_gcs.tensorflow_env({"proxy": proxy, "storage": "http://127.0.0.1:2", "ca_bundle": "/x/ca.pem"}, None, {})
        assert env[tf_gcs.ROUTED_ENV] == proxy and tf_gcs.routed(env)
        assert not tf_gcs.routed({**env, "HTTPS_PROXY": "http://127.0.0.1:9"})  # another proxy set since
        assert not tf_gcs.routed({k: v for k, v in env.items() if k != "CURL_CA_BUNDLE"})
    assert not tf_gcs.routed(env)  # its gateway is gone
    assert not tf_gcs.routed({})


def test_the_certificate_is_for_googles_storage_hosts_and_the_bundle_trusts_it(tmp_path):
    cert, key, bundle = tf_gcs.make_certificates(tmp_path)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(bundle))
    import socket
    import threading

    for host in tf_gcs.GOOGLE_HOSTS:
        a, b = socket.socketpair()
        done = threading.Thread(target=lambda: server.wrap_socket(a, server_side=True).close())
        done.start()
        client.wrap_socket(b, server_hostname=host).close()  # raises unless the name and the chain check
        done.join(10)
    with pytest.raises(ssl.SSLCertVerificationError):
        a, b = socket.socketpair()
        threading.Thread(target=lambda: _quietly(lambda: server.wrap_socket(a, server_side=True)), daemon=True).start()
        client.wrap_socket(b, server_hostname="evil.example")
    assert (tmp_path / "gateway.key").stat().st_mode & 0o077 == 0
    assert bundle.read_bytes().count(b"BEGIN CERTIFICATE") > 1  # the CAs already trusted, too


def _quietly(fn):
    try:
        fn()
    except OSError:
        pass


# ---- TensorFlow in a user's process, against a storage behind a token and TLS ----------------------
USER_PROCESS = r'''
import json, os, sys
import modelyard.tf_gcs
modelyard.tf_gcs.enable(sys.argv[1], token=sys.argv[2])
import numpy as np, tensorflow as tf, tf_keras as keras
base = "gs://tfbucket/run"
if sys.argv[3] == "wrong":
    try:
        with tf.io.gfile.GFile("gs://tfbucket/intruder.txt", "w") as f:
            f.write("x")
    except tf.errors.OpError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)[:300]}))
    sys.exit(0)
ckpt = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]))
path = ckpt.save(base + "/ckpt/c")
ckpt.v.assign([0.0, 0.0])
ckpt.restore(tf.train.latest_checkpoint(base + "/ckpt")).assert_consumed()
with tf.summary.create_file_writer(base + "/logs").as_default():
    tf.summary.scalar("loss", 0.5, step=1)
with tf.io.TFRecordWriter(base + "/data/part-0.tfrecord") as w:
    for i in range(3):
        w.write(str(i).encode())
read = [r.numpy().decode() for r in tf.data.TFRecordDataset(tf.io.gfile.glob(base + "/data/*.tfrecord"))]
model = keras.Sequential([keras.layers.Dense(1, input_shape=(2,))])
model.compile("sgd", "mse")
model.fit(np.ones((4, 2)), np.ones(4), epochs=2, verbose=0,
          callbacks=[keras.callbacks.BackupAndRestore(base + "/backup")])
model.save(base + "/model")
loaded = tf.saved_model.load(base + "/model")
print(json.dumps({"restored": ckpt.v.numpy().tolist(), "read": read, "signatures": list(loaded.signatures),
                  "files": sorted(tf.io.gfile.glob(base + "/*")), "events": tf.io.gfile.glob(base + "/logs/events.*")}))
'''


@pytest.fixture(scope="module")
def secured_storage(tmp_path_factory):
    from tests.serving.security.pki import make_pki

    work = tmp_path_factory.mktemp("tfgcs")
    pki = make_pki(work)
    (work / "server.pem").write_text(pki.server_cert_pem)
    (work / "server.key").write_text(pki.server_key_pem)
    (work / "ca.pem").write_text(pki.ca_pem)
    p = StorageProcess(work / "root", work / "storage.log", ["--auth-token", "tf-secret", "--tls-cert",
                                                             str(work / "server.pem"), "--tls-key", str(work / "server.key")])
    url = f"https://127.0.0.1:{p.port}"
    deadline = time.monotonic() + 30
    while True:
        assert p.proc.poll() is None, p.log.read_text()
        try:
            r = requests.post(f"{url}/storage/v1/b?project=p", json={"name": "tfbucket"},
                              headers={"Authorization": "Bearer tf-secret"}, verify=str(work / "ca.pem"), timeout=2)
            assert r.status_code == 200, r.text
            break
        except requests.ConnectionError:
            assert time.monotonic() < deadline, p.log.read_text()
            time.sleep(0.1)
    yield url, work / "ca.pem", p.root
    p.stop()


def _user_process(url: str, ca: Path, token: str, mode: str = "right") -> dict:
    # The storage's CA as every Python client of a TLS platform is told it (SSL_CERT_FILE).
    env = _env(SSL_CERT_FILE=str(ca), REQUESTS_CA_BUNDLE=str(ca))
    script = ca.with_name("user_process.py")
    script.write_text(USER_PROCESS)
    # Forked from this worker's warm interpreter (tests/warm_process.py): the user's script, not TensorFlow's import.
    done = run_python([sys.executable, str(script), url, token, mode], env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tensorflow_in_a_users_process_reaches_a_storage_behind_a_token_and_tls(secured_storage):
    url, ca, root = secured_storage
    got = _user_process(url, ca, "tf-secret")
    assert got["restored"] == [1.0, 2.0] and got["read"] == ["0", "1", "2"] and got["signatures"] == ["serving_default"]
    assert {f.rsplit("/", 1)[1] for f in got["files"]} >= {"ckpt", "logs", "data", "model"} and got["events"]
    assert (root / "tfbucket" / "run" / "model" / "saved_model.pb").is_file()  # the storage's own files
    refused = _user_process(url, ca, "not-the-token", "wrong")
    assert "HTTP response code 401" in refused["message"], refused  # the storage's refusal, through TensorFlow
    assert not (root / "tfbucket" / "intruder.txt").exists()


# ---- modelyard train with gs:// data, job dir and export ----------------------------------------------
def test_modelyard_train_reads_and_writes_gs_paths_of_a_storage_behind_a_token_and_tls(secured_storage, tmp_path):
    """``modelyard train`` (training.uri_paths): its data is read from gs://, its checkpoints, backup,
    TensorBoard events, metrics.json and exported model are written to gs://, all through TensorFlow's
    own gs:// (tf_gcs.enable from STORAGE_EMULATOR_HOST and MODELYARD_STORAGE_TOKEN), TLS checked."""
    import io

    import yaml
    from sklearn.datasets import load_digits

    url, ca, root = secured_storage
    digits = load_digits()
    x = np.repeat(np.repeat(digits.images[:96], 4, axis=1), 4, axis=2)[:, 2:30, 2:30] * 15  # 28x28 uint8 range
    buf = io.BytesIO()
    np.savez(buf, x=x.astype(np.uint8), y=digits.target[:96].astype(np.int64))
    r = requests.post(f"{url}/upload/storage/v1/b/tfbucket/o?uploadType=media&name=train/digits.npz",
                      data=buf.getvalue(), headers={"Authorization": "Bearer tf-secret"}, verify=str(ca), timeout=10)
    assert r.status_code == 200, r.text
    config = tmp_path / "gs.yaml"
    config.write_text(yaml.safe_dump({"model": "demo", "data": {"source": "gs://tfbucket/train/digits.npz"},
                                      "global_batch_size": 16, "epochs": 2, "job_dir": "gs://tfbucket/train/run",
                                      "export_to": "gs://tfbucket/train/model", "input_report": False}))
    env = _env(STORAGE_EMULATOR_HOST=url, MODELYARD_STORAGE_TOKEN="tf-secret", SSL_CERT_FILE=str(ca),
               REQUESTS_CA_BUNDLE=str(ca), TF_USE_LEGACY_KERAS="1")
    done = run_python([sys.executable, "-m", "modelyard", "train", str(config)], env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert "exported gs://tfbucket/train/model/0001" in done.stdout, done.stdout
    run = root / "tfbucket" / "train" / "run"  # the storage's own files
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["completed"] and len(metrics["epochs"]) == 2, metrics
    assert (run / "config.resolved.json").is_file()
    assert (run / "checkpoints" / "ckpt-0002.index").is_file(), sorted(p.name for p in run.rglob("*"))
    assert list((run / "tensorboard" / "train").glob("events.out.tfevents.*")), sorted(p.name for p in run.rglob("*"))
    model = root / "tfbucket" / "train" / "model" / "0001"
    assert (model / "saved_model.pb").is_file() and (model / "variables" / "variables.index").is_file()
    assert not (tmp_path / "gs:").exists()  # never read as a local relative path


# ---- the textbook's training script as a CustomTrainingJob ------------------------------------------
@pytest.fixture(scope="module")
def sdk(aiplatform):  # noqa: F811
    from google.cloud.aiplatform import training_jobs

    saved = training_jobs._JOB_WAIT_TIME
    training_jobs._JOB_WAIT_TIME = 0.5  # the SDK polls a pipeline every 5 s
    yield aiplatform
    training_jobs._JOB_WAIT_TIME = saved


def test_the_books_training_script_saves_to_aip_model_dir_and_its_model_serves(sdk, platform, gcs_emulator):
    try:
        _run_the_book(sdk, platform, gcs_emulator)
    finally:  # a job left running by a failure midway
        for pid in job_processes(platform):
            _quietly(lambda: os.kill(pid, 9))


def _run_the_book(sdk, platform, gcs_emulator):
    job = sdk.CustomTrainingJob(display_name="book-train", script_path=BOOK_SCRIPT, container_uri=TRAIN_IMAGE,
                                model_serving_container_image_uri=SERVE_IMAGE)
    # As the book runs it: a chief and one worker (MultiWorkerMirroredStrategy; only the chief writes gs://).
    model = job.run(replica_count=2, machine_type="n1-standard-4")
    base = job.gca_resource.training_task_inputs["base_output_directory"]["output_uri_prefix"].rstrip("/")
    assert base.startswith(f"gs://{STAGING_BUCKET}/") and model.uri.rstrip("/") == f"{base}/model"

    prefix = base[len(f"gs://{STAGING_BUCKET}/"):]
    names = [b.name[len(prefix) + 1:] for b in gcs_emulator["client"].list_blobs(STAGING_BUCKET, prefix=prefix + "/")]
    assert "model/saved_model.pb" in names and "model/variables/variables.index" in names
    assert "checkpoints/saved_model.pb" in names  # ModelCheckpoint(AIP_CHECKPOINT_DIR): the whole model, each epoch
    assert any(n.startswith("logs/train/events.out.tfevents.") for n in names), names

    import tensorflow as tf

    tf_gcs.enable(platform.storage_url)  # this process's own TensorFlow, as a user's notebook does it
    try:
        assert tf.io.gfile.glob(f"{base}/checkpoints/saved_model.pb") == [f"{base}/checkpoints/saved_model.pb"]
        events = tf.io.gfile.glob(f"{base}/logs/*/events.out.tfevents.*")
        assert {e.split("/")[-2] for e in events} == {"train", "validation"}, events
        losses = [v.tensor for e in tf.compat.v1.train.summary_iterator(events[0]) for v in e.summary.value
                  if v.tag == "epoch_loss"]
        assert len(losses) == 2  # the two epochs, read back through gs://
    finally:
        tf_gcs.disable()

    endpoint = model.deploy(machine_type="n1-standard-4", min_replica_count=1, max_replica_count=1)
    try:
        from sklearn.datasets import load_digits

        digits = load_digits()
        got = endpoint.predict(instances=(digits.images[:3] / 16.0).tolist())
        assert np.asarray(got.predictions).shape == (3, 10)
        np.testing.assert_allclose(np.sum(got.predictions, axis=1), 1.0, rtol=1e-4)  # softmax rows
    finally:
        endpoint.undeploy_all()
        endpoint.delete()
    model.delete()


def test_the_gateway_listens_on_loopback_only():
    """It forwards with a job's token: a --host beyond this machine is refused at the command line."""
    import argparse

    parser = argparse.ArgumentParser()
    tf_gcs.add_arguments(parser)
    assert parser.parse_args(["--host", "::1"]).host == "::1"
    assert parser.parse_args([]).host == "127.0.0.1"
    for host in ("0.0.0.0", "192.168.1.5", "example.com"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--host", host])
