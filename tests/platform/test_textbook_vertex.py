"""Issue 34, must-show 1: the textbook's Vertex AI cells run as written against ``modelyard platform``.

The cells are those of "Training and Deploying TensorFlow Models at Scale" (Géron, Hands-On Machine
Learning, 3rd ed., notebook ``19_training_and_deploying_at_scale.ipynb`` of github.com/ageron/handson-ml3,
Apache-2.0), copied below verbatim, cell by cell, and executed in order in one namespace, as Jupyter
would: the sections "Creating a Prediction Service on Vertex AI" and "Running Batch Prediction Jobs on
Vertex AI" (cells 62-83). What the cells need from earlier in the chapter (the uint8-input MNIST model
saved at ``my_mnist_model/0001``, ``X_new``, ``X_test``, ``y_test`` and the imports of ``json`` and
``Path``) is built here by the chapter's own recipe on ``modelyard.datasets.load_digits_28`` (MNIST is a
download), in a separate process so TensorFlow stays out of pytest. One preamble cell points the stock
SDK and ``google-cloud-storage`` at the session platform (tests/platform/conftest.py), the only process.
Where a cell is changed, a comment at the change says why; nothing else differs from the book.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.platform.conftest import _env, require

# The chapter's MNIST model (cell 20: Flatten of uint8 28x28, Rescaling, Dense(100), Dense(10) softmax,
# saved with model.save(..., save_format="tf")) trained briefly on the 28x28 digits; leaves in the working
# directory my_mnist_model/0001 and state.npz with X_test, y_test and the model's own probabilities.
_BUILD = """
import numpy as np
from pathlib import Path
import tf_keras as keras
from modelyard.datasets import load_digits_28

X_train, y_train = load_digits_28("train")
X_test, y_test = load_digits_28("test")
keras.utils.set_random_seed(42)
model = keras.Sequential([
    keras.layers.Flatten(input_shape=[28, 28], dtype="uint8"),
    keras.layers.Rescaling(scale=1 / 255),
    keras.layers.Dense(100, activation="relu"),
    keras.layers.Dense(10, activation="softmax")])
model.compile(loss="sparse_categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
model.fit(X_train, y_train, epochs=5, verbose=0)
model.save(Path("my_mnist_model") / "0001", save_format="tf")
np.savez("state.npz", X_test=X_test, y_test=y_test, y_proba=model.predict(X_test[:100], verbose=0))
"""

BUCKET = "my_bucket"  # the notebook's bucket_name; the session platform lists gs://my_bucket in --artifact-root

# The preamble: the one cell a user adds to the notebook to use the platform instead of Google Cloud.
# PLATFORM and STORAGE are the session platform's URLs (http://localhost:8600 and :8601 for a user).
PREAMBLE = """
import os
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform

os.environ["STORAGE_EMULATOR_HOST"] = STORAGE  # as `modelyard platform` prints at start
aiplatform.init(project="my_project", location="us-central1", api_endpoint=PLATFORM, api_transport="rest",
                credentials=AnonymousCredentials())
"""

# (cell number in the notebook, source as written)
CELLS = [
    (62, '''
project_id = "my_project"  ##### CHANGE THIS TO YOUR PROJECT ID #####

if "google.colab" in sys.modules:
    from google.colab import auth
    auth.authenticate_user()
elif "kaggle_secrets" in sys.modules:
    from kaggle_secrets import UserSecretsClient
    UserSecretsClient().set_gcloud_credentials(project=project_id)
else:
    os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = "my_service_account_key.json"
'''),
    (63, '''
from google.cloud import storage

bucket_name = "my_bucket"  ##### CHANGE THIS TO A UNIQUE BUCKET NAME #####
location = "us-central1"

storage_client = storage.Client(project=project_id)
bucket = storage_client.create_bucket(bucket_name, location=location)
#bucket = storage_client.bucket(bucket_name)  # to reuse a bucket instead
'''),
    (64, '''
def upload_directory(bucket, dirpath):
    dirpath = Path(dirpath)
    for filepath in dirpath.glob("**/*"):
        if filepath.is_file():
            blob = bucket.blob(filepath.relative_to(dirpath.parent).as_posix())
            blob.upload_from_filename(filepath)

upload_directory(bucket, "my_mnist_model")
'''),
    (65, '''
# extra code – a much faster multithreaded implementation of upload_directory()
#              which also accepts a prefix for the target path, and prints stuff

from concurrent import futures

def upload_file(bucket, filepath, blob_path):
    blob = bucket.blob(blob_path)
    blob.upload_from_filename(filepath)

def upload_directory(bucket, dirpath, prefix=None, max_workers=50):
    dirpath = Path(dirpath)
    prefix = prefix or dirpath.name
    with futures.ThreadPoolExecutor(max_workers=max_workers) as executor:
        future_to_filepath = {
            executor.submit(
                upload_file,
                bucket, filepath,
                f"{prefix}/{filepath.relative_to(dirpath).as_posix()}"
            ): filepath
            for filepath in sorted(dirpath.glob("**/*"))
            if filepath.is_file()
        }
        for future in futures.as_completed(future_to_filepath):
            filepath = future_to_filepath[future]
            try:
                result = future.result()
            except Exception as ex:
                print(f"Error uploading {filepath!s:60}: {ex}")  # f!s is str(f)
            else:
                print(f"Uploaded {filepath!s:60}", end="\\r")

    print(f"Uploaded {dirpath!s:60}")
'''),
    (67, '''
#!gsutil -m cp -r my_mnist_model gs://{bucket_name}/
'''),
    (68, '''
from google.cloud import aiplatform

server_image = "gcr.io/cloud-aiplatform/prediction/tf2-gpu.2-8:latest"

aiplatform.init(project=project_id, location=location)
mnist_model = aiplatform.Model.upload(
    display_name="mnist",
    artifact_uri=f"gs://{bucket_name}/my_mnist_model/0001",
    serving_container_image_uri=server_image,
)
'''),
    (70, '''
endpoint = aiplatform.Endpoint.create(display_name="mnist-endpoint")

endpoint.deploy(
    mnist_model,
    min_replica_count=1,
    max_replica_count=5,
    machine_type="n1-standard-4",
    accelerator_type="NVIDIA_TESLA_K80",
    accelerator_count=1
)
'''),
    (71, '''
response = endpoint.predict(instances=X_new.tolist())
'''),
    (72, '''
import numpy as np

np.round(response.predictions, 2)
'''),
    (73, '''
endpoint.undeploy_all()  # undeploy all models from the endpoint
endpoint.delete()
'''),
    (75, '''
batch_path = Path("my_mnist_batch")
batch_path.mkdir(exist_ok=True)
with open(batch_path / "my_mnist_batch.jsonl", "w") as jsonl_file:
    for image in X_test[:100].tolist():
        jsonl_file.write(json.dumps(image))
        jsonl_file.write("\\n")

upload_directory(bucket, batch_path)
'''),
    (76, '''
batch_prediction_job = mnist_model.batch_predict(
    job_display_name="my_batch_prediction_job",
    machine_type="n1-standard-4",
    starting_replica_count=1,
    max_replica_count=5,
    accelerator_type="NVIDIA_TESLA_K80",
    accelerator_count=1,
    gcs_source=[f"gs://{bucket_name}/{batch_path.name}/my_mnist_batch.jsonl"],
    gcs_destination_prefix=f"gs://{bucket_name}/my_mnist_predictions/",
    sync=True  # set to False if you don't want to wait for completion
)
'''),
    (77, '''
batch_prediction_job.output_info  # extra code – shows the output directory
'''),
    (78, '''
y_probas = []
for blob in batch_prediction_job.iter_outputs():
    print(blob.name)  # extra code
    if "prediction.results" in blob.name:
        for line in blob.download_as_text().splitlines():
            y_proba = json.loads(line)["prediction"]
            y_probas.append(y_proba)
'''),
    (79, '''
y_pred = np.argmax(y_probas, axis=1)
accuracy = np.sum(y_pred == y_test[:100]) / 100
'''),
    (80, '''
accuracy
'''),
    (81, '''
mnist_model.delete()
'''),
    (83, '''
for prefix in ["my_mnist_model/", "my_mnist_batch/", "my_mnist_predictions/"]:
    blobs = bucket.list_blobs(prefix=prefix)
    for blob in blobs:
        blob.delete()

#bucket.delete()  # uncomment and run if you want to delete the bucket itself
batch_prediction_job.delete()
'''),
]


@pytest.fixture(scope="module")
def chapter(tmp_path_factory) -> tuple[Path, dict]:
    """The working directory the notebook runs in (my_mnist_model/0001 in it) and the state its earlier
    cells leave: the names cells 62-83 use, as the chapter defines them (cell 38: X_new = X_test[:3])."""
    workdir = tmp_path_factory.mktemp("chapter19")
    done = subprocess.run([sys.executable, "-c", _BUILD], cwd=workdir, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = np.load(workdir / "state.npz")
    X_test, y_test = saved["X_test"], saved["y_test"]
    names = {"os": os, "sys": sys, "json": json, "Path": Path, "np": np,
             "X_test": X_test, "y_test": y_test, "X_new": X_test[:3]}
    return workdir, {"names": names, "y_proba": saved["y_proba"]}


@contextlib.contextmanager
def _notebook_process_state():
    """The cells set environment variables and the SDK's global configuration, as a notebook does;
    the other tests of this pytest process get theirs back afterwards."""
    from google.cloud.aiplatform import initializer
    from google.cloud.aiplatform import jobs as sdk_jobs

    keys = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")
    env = {k: os.environ.get(k) for k in keys}
    config = dict(vars(initializer.global_config))
    wait = sdk_jobs._JOB_WAIT_TIME
    cwd = os.getcwd()
    try:
        yield
    finally:
        os.chdir(cwd)
        sdk_jobs._JOB_WAIT_TIME = wait
        vars(initializer.global_config).clear()
        vars(initializer.global_config).update(config)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(cell: str, ns: dict):
    """One cell as Jupyter runs it: statements, then the value of a last bare expression (its Out[])."""
    import ast

    tree = ast.parse(cell)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), ns)
    return eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns) if last is not None else None


def test_the_chapters_vertex_cells_run_as_written(platform, chapter, gcs_emulator):
    require("google.cloud.aiplatform", "pip install -e '.[test]' (installs google-cloud-aiplatform)")
    import requests
    from google.api_core import exceptions
    from google.cloud.aiplatform import jobs as sdk_jobs

    workdir, state = chapter
    ns = dict(state["names"], PLATFORM=platform.url, STORAGE=platform.storage_url)
    out = {}
    with _notebook_process_state():
        os.chdir(workdir)  # the notebook's working directory: my_mnist_model/ is beside it
        sdk_jobs._JOB_WAIT_TIME = 0.5  # the SDK polls a job every 5 s; the result is the same, sooner
        _run(PREAMBLE, ns)
        for number, source in CELLS:
            out[number] = _run(source, ns)
            if number == 68:
                _staging_bucket_works_the_same(ns)
            if number == 76:  # (its state is read before cell 83 deletes the job)
                job_state = ns["batch_prediction_job"].state.name
            if number == 73:  # undeploy_all() left no replica of it running
                replicas = requests.get(f"{platform.url}/modelyard/v1/replicas", timeout=5).json()["replicas"]
                assert [r for r in replicas if r["endpointId"] == ns["endpoint"].name] == []

        mnist_model, response = ns["mnist_model"], ns["response"]
        assert mnist_model.uri == "gs://my_bucket/my_mnist_model/0001"
        # The SDK sent the uint8 pixels as doubles; the model answered as it does itself (Vertex's integer rule).
        np.testing.assert_allclose(response.predictions, state["y_proba"][:3], rtol=1e-4, atol=1e-5)
        assert out[72].shape == (3, 10)
        with pytest.raises(exceptions.NotFound):
            ns["aiplatform"].Endpoint(ns["endpoint"].resource_name).display_name  # deleted by cell 73 (loaded lazily)

        # The batch job: one result line per image, each the model's own; the accuracy cell is the model's.
        assert job_state == "JOB_STATE_SUCCEEDED"
        assert out[77].gcs_output_directory.startswith("gs://my_bucket/my_mnist_predictions/prediction-")
        np.testing.assert_allclose(ns["y_probas"], state["y_proba"], rtol=1e-4, atol=1e-5)
        expected = np.sum(np.argmax(state["y_proba"], axis=1) == ns["y_test"][:100]) / 100
        assert out[80] == expected and expected > 0.8

        # The clean-up cells left nothing of the three prefixes, and the model is gone.
        client = gcs_emulator["client"]
        for prefix in ("my_mnist_model/", "my_mnist_batch/", "my_mnist_predictions/"):
            assert list(client.list_blobs(BUCKET, prefix=prefix)) == []
        with pytest.raises(exceptions.NotFound):
            ns["aiplatform"].Model(mnist_model.resource_name)
        with pytest.raises(exceptions.NotFound):
            ns["aiplatform"].BatchPredictionJob(ns["batch_prediction_job"].resource_name)


def _staging_bucket_works_the_same(ns: dict) -> None:
    """Cell 68 with a local artifact_uri and a staging_bucket: the SDK copies the directory to the
    bucket, and the platform takes that copy as it took the notebook's own upload."""
    aiplatform = ns["aiplatform"]
    local = Path("my_mnist_model") / "0001"
    model = aiplatform.Model.upload(display_name="mnist-staged", artifact_uri=str(local),
                                    serving_container_image_uri=ns["server_image"],
                                    staging_bucket=f"gs://{ns['bucket_name']}")
    try:
        assert model.uri.startswith(f"gs://{ns['bucket_name']}/")
        prefix = model.uri[len(f"gs://{ns['bucket_name']}/"):].rstrip("/") + "/"
        staged = {b.name[len(prefix):]: b.download_as_bytes() for b in ns["bucket"].list_blobs(prefix=prefix)}
        files = {f.relative_to(local).as_posix(): f.read_bytes() for f in local.rglob("*") if f.is_file()}
        assert staged == files
        assert model.gca_resource.container_spec.image_uri == ns["server_image"]
    finally:
        model.delete()
        for blob in ns["bucket"].list_blobs(prefix=model.uri[len(f"gs://{ns['bucket_name']}/"):]):
            blob.delete()
