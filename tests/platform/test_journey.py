"""The journey a Vertex AI user runs, in order, on the session platform with the stock clients only
(kfp, google-cloud-aiplatform, google-cloud-storage, requests): parts each tested alone elsewhere, here
tested together, since a model made one way and served another is where they meet.

A kfp v2 pipeline of lightweight Python components trains a tiny Keras model on generated data and
saves it with TensorFlow's own ``gs://`` filesystem under the pipeline root (the job's storage gateway,
not the ``/gcs/`` mount), logging a metric; it is submitted with ``experiment=``, and the metric is read
back from ``get_experiment_df``. The model is uploaded from that ``gs://`` path with the prebuilt TF
serving image, deployed into a deployment resource pool (issue 48) and predicted through the SDK, and
the same ``gs://`` path is served by ``modelyard serve --model_base_path gs://...`` (issue 44's mirror)
over TF Serving's REST API: both answer what the model computes, worked out here from the weights its
train step recorded (no TensorFlow in the test process). Cleaned up at the end: undeployed, pool,
endpoint and model deleted.

It lives under tests/platform to share the session's platform (tests/platform/conftest.py) rather than
start one. No ``from __future__ import annotations``: kfp reads the component's annotations as types.
"""
import numpy as np
import pytest
import requests
from kfp import dsl

from tests.platform.conftest import STAGING_BUCKET
from tests.platform.jobs_helpers import aiplatform, no_stray_jobs, pipeline_sdk  # noqa: F401
from tests.serving.server_process import ServerProcess

pytestmark = pytest.mark.e2e

ROOT = f"gs://{STAGING_BUCKET}/journey-root"
SERVE_IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-12:latest"  # a prebuilt TF serving image
INSTANCES = [[1.0, 0.0, -1.0], [0.5, 2.0, 0.25], [-3.0, 1.0, 0.0]]


@dsl.component(base_image="python:3.11")
def train(rows: int, model: dsl.Output[dsl.Model], metrics: dsl.Output[dsl.Metrics]):
    import os

    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 3)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.25
    net = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(1)])
    net.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    history = net.fit(x, y, epochs=3, batch_size=16, verbose=0)
    # TensorFlow's own gs:// (model.uri), in TF Serving's layout: a version directory under the base path.
    net.export(os.path.join(model.uri, "1"))
    kernel, bias = net.get_weights()
    model.metadata.update(kernel=kernel.tolist(), bias=bias.tolist())  # the test computes the answers from them
    metrics.log_metric("loss", float(history.history["loss"][-1]))


@dsl.pipeline(name="journey")
def journey(rows: int = 64):
    train(rows=rows)


def test_a_pipeline_trained_model_is_tracked_pooled_and_served_from_its_gs_path(sdk, platform, gcs_emulator,
                                                                                 tmp_path):
    from kfp import compiler

    template = str(tmp_path / "journey.yaml")
    compiler.Compiler().compile(journey, template)
    job = sdk.PipelineJob(display_name="journey", template_path=template, pipeline_root=ROOT, job_id="journey-1",
                          parameter_values={"rows": 64}, enable_caching=False)
    job.submit(experiment="journey-exp")
    job.wait()
    assert job.state.name == "PIPELINE_STATE_SUCCEEDED"

    # The model: a kfp Model artifact under the pipeline root, written by TensorFlow through gs://.
    step = {t.task_name: t for t in job.task_details}["train"]
    base = step.outputs["model"].artifacts[0].uri
    assert base == f"{ROOT}/journey-1/train/model"
    prefix = base[len(f"gs://{STAGING_BUCKET}/"):]
    names = {b.name[len(prefix) + 1:] for b in gcs_emulator["client"].list_blobs(STAGING_BUCKET, prefix=prefix + "/")}
    assert {"1/saved_model.pb", "1/variables/variables.index"} <= names, names
    weights = step.outputs["model"].artifacts[0].metadata
    want = np.asarray(INSTANCES) @ np.asarray(weights["kernel"]) + np.asarray(weights["bias"])  # the model's own
    loss = step.outputs["metrics"].artifacts[0].metadata["loss"]
    # Tracked: the run and its metric in the experiment's data frame.
    df = sdk.get_experiment_df("journey-exp")
    row = df[df.run_name == "journey-1"].iloc[0]
    assert row.run_type == "system.PipelineRun" and row.state == "COMPLETE"
    assert row["param.rows"] == 64 and row["metric.loss"] == pytest.approx(loss)

    # The same gs:// path served as TF Serving serves a base path (its mirror of the bucket): started now, it
    # loads while the platform deploys.
    server = ServerProcess("--model_name", "journey", "--model_base_path", base, log_dir=tmp_path,
                           env={"STORAGE_EMULATOR_HOST": platform.storage_url, "MODELYARD_CACHE": str(tmp_path / "cache")})

    # Uploaded from the gs:// path, deployed into a deployment resource pool, predicted through the SDK.
    pool = endpoint = model = None
    try:
        model = sdk.Model.upload(display_name="journey-model", artifact_uri=f"{base}/1",
                                 serving_container_image_uri=SERVE_IMAGE)
        pool = sdk.DeploymentResourcePool.create(deployment_resource_pool_id="journey-pool",
                                                 machine_type="n1-standard-2", min_replica_count=1, max_replica_count=1)
        endpoint = sdk.Endpoint.create(display_name="journey-endpoint")
        endpoint.deploy(model, deployment_resource_pool=pool)
        answer = endpoint.predict(instances=INSTANCES)
        np.testing.assert_allclose(answer.predictions, want, rtol=1e-5, atol=1e-6)
        assert answer.model_resource_name == model.resource_name
        assert endpoint.list_models()[0].shared_resources == pool.resource_name

        server.wait_ready()
        status = requests.get(f"{server.base}/v1/models/journey", timeout=10).json()
        assert status["model_version_status"][0]["state"] == "AVAILABLE", status
        served = requests.post(f"{server.base}/v1/models/journey:predict", json={"instances": INSTANCES}, timeout=30)
        assert served.status_code == 200, served.text
        np.testing.assert_allclose(served.json()["predictions"], want, rtol=1e-5, atol=1e-6)
    finally:
        server.stop()
        if endpoint is not None:
            endpoint.undeploy_all()
            endpoint.delete()
        if pool is not None:
            pool.delete()
        if model is not None:
            model.delete()
