"""Vertex AI Experiments through the stock SDK against the session platform: what Google's system
tests (tests/system/aiplatform/test_experiments.py, test_e2e_metadata_schema.py, test_tensorboard.py
of googleapis/python-aiplatform) do, as our own flows. The tests of this module run in order and
share one experiment (their module state), as Google's class does."""
from __future__ import annotations

import pandas as pd
import pytest
import requests

from tests.platform.conftest import PARENT, STAGING_BUCKET as STAGING
from tests.platform.jobs_helpers import aiplatform  # noqa: F401  (the module's SDK fixture)

EXPERIMENT = "exp-flows"
PARAMS = {"sdk-param-test-1": 0.1, "sdk-param-test-2": 0.2}
METRICS = {"sdk-metric-test-1": 0.8, "sdk-metric-test-2": 100.0}
PARAMS_2 = {"sdk-param-test-1": 0.2, "sdk-param-test-2": 0.4}
METRICS_2 = {"sdk-metric-test-1": 1.6, "sdk-metric-test-2": 200.0}
CLASSIFICATION = {"display_name": "my-classification-metrics", "labels": ["cat", "dog"],
                  "matrix": [[9, 1], [1, 9]], "fpr": [0.1, 0.5, 0.9], "tpr": [0.1, 0.7, 0.9],
                  "threshold": [0.9, 0.5, 0.1]}
STATE: dict = {}


@pytest.fixture(scope="module")
def sdk(aiplatform):  # noqa: F811
    import google.auth
    import google.auth.credentials

    # The SDK asks google.auth.default() for credentials when it reuses a global experiment TensorBoard
    # (metadata._ExperimentTracker._get_global_tensorboard), whatever init() was given: this machine has
    # no Google credentials, as a local platform's user need not have.
    saved = google.auth.default
    google.auth.default = lambda *a, **k: (google.auth.credentials.AnonymousCredentials(), "local")
    yield aiplatform
    google.auth.default = saved
    aiplatform.metadata.metadata._experiment_tracker.reset()  # no experiment left set for other modules


def _df_records(df: pd.DataFrame) -> list[dict]:
    return sorted(df.fillna(0.0).to_dict("records"), key=lambda d: d["run_name"])


def test_experiment_runs_log_params_metrics_and_time_series(sdk):
    from google.api_core import exceptions

    tensorboard = sdk.Tensorboard.create(display_name="experiments-tb")
    STATE["tensorboard"] = tensorboard
    sdk.init(experiment=EXPERIMENT, experiment_tensorboard=tensorboard)
    experiment = sdk.Experiment(EXPERIMENT)
    assert experiment.name == EXPERIMENT
    assert experiment.get_backing_tensorboard_resource().resource_name == tensorboard.resource_name
    assert any(e.name == EXPERIMENT for e in sdk.Experiment.list())
    assert [e.name for e in sdk.Experiment.list(filter=f'display_name="{EXPERIMENT}"')] == [EXPERIMENT]
    assert sdk.Experiment.list(filter='display_name="no-such-experiment"') == []

    run = sdk.start_run("run-1")
    assert run.name == "run-1"
    assert sdk.ExperimentRun("run-1", experiment=EXPERIMENT).state == sdk.gapic.Execution.State.RUNNING
    sdk.log_params(PARAMS)
    sdk.log_metrics(METRICS)
    for i in range(5):
        sdk.log_time_series_metrics({"accuracy": i})
    again = sdk.ExperimentRun("run-1", experiment=EXPERIMENT)
    assert again.get_params() == PARAMS
    assert again.get_metrics() == METRICS
    series = again.get_time_series_data_frame()[["accuracy", "step"]].to_dict("list")
    assert series == {"step": [1, 2, 3, 4, 5], "accuracy": [0.0, 1.0, 2.0, 3.0, 4.0]}

    # 21 series: more than the SDK reads in one batchRead (20), so it reads in two.
    for i in range(21):
        sdk.log_time_series_metrics({f"accuracy-{i}": 1})
    assert len(again.get_time_series_data_frame()) > 20

    metrics = sdk.log_classification_metrics(**CLASSIFICATION)
    assert metrics.schema_title == "google.ClassificationMetrics"
    stored = sdk.ExperimentRun("run-1", experiment=EXPERIMENT).get_classification_metrics()[0]
    metric_artifact = sdk.Artifact(stored.pop("id"))
    assert stored == CLASSIFICATION
    metric_artifact.delete()  # as Google's test does: the run's artifacts are counted below
    sdk.end_run()
    assert sdk.ExperimentRun("run-1", experiment=EXPERIMENT).state == sdk.gapic.Execution.State.COMPLETE

    with sdk.start_run("run-2") as run2:
        run2.log_params(PARAMS_2)
        run2.log_metrics(METRICS_2)
        run2.log_time_series_metrics({"accuracy": 0.5}, step=7)
        assert run2.state == sdk.gapic.Execution.State.RUNNING
    assert run2.state == sdk.gapic.Execution.State.COMPLETE

    with pytest.raises(exceptions.NotFound):
        sdk.ExperimentRun("never-started", experiment=EXPERIMENT)


def test_get_experiment_df_with_and_without_time_series(sdk):
    sdk.init(experiment=EXPERIMENT)
    df = sdk.get_experiment_df()
    base = {"experiment_name": EXPERIMENT, "run_type": "system.ExperimentRun", "state": "COMPLETE"}
    run1 = {**base, "run_name": "run-1", **{f"param.{k}": v for k, v in PARAMS.items()},
            **{f"metric.{k}": v for k, v in METRICS.items()}, "time_series_metric.accuracy": 4.0,
            **{f"time_series_metric.accuracy-{i}": 1.0 for i in range(21)}}
    run2 = {**base, "run_name": "run-2", **{f"param.{k}": v for k, v in PARAMS_2.items()},
            **{f"metric.{k}": v for k, v in METRICS_2.items()}, "time_series_metric.accuracy": 0.5,
            **{f"time_series_metric.accuracy-{i}": 0.0 for i in range(21)}}
    assert _df_records(df) == [run1, run2]

    df = sdk.get_experiment_df(include_time_series=False)
    strip = lambda d: {k: v for k, v in d.items() if not k.startswith("time_series_metric.")}  # noqa: E731
    assert _df_records(df) == [strip(run1), strip(run2)]


def test_console_shows_experiments_runs_side_by_side_and_their_time_series(sdk, platform):
    import html
    import json
    import re

    sdk.Experiment.create(experiment_name="exp-escaped", description="<script>alert(1)</script>")
    page = requests.get(f"{platform.url}/console/experiments", timeout=30)
    assert page.status_code == 200
    section = page.text.split(f'data-experiment="{EXPERIMENT}"', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r'<tr class="run">(.*?)</tr>', section)
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in rows]
    assert [(c[0], c[1]) for c in cells] == [("run-1", "COMPLETE"), ("run-2", "COMPLETE")]
    head = re.findall(r"<th>(.*?)</th>", section)
    assert cells[0][head.index("param.sdk-param-test-1")] == "0.1"
    assert cells[1][head.index("metric.sdk-metric-test-2")] == "200"
    charts = dict(re.findall(r'<figcaption>(.*?)</figcaption><canvas height="140" data-series="(.*?)"', section))
    accuracy = json.loads(html.unescape(charts["accuracy"]))
    assert [(line["label"], [p[1] for p in line["points"]]) for line in accuracy] == [
        ("run-1", [0.0, 1.0, 2.0, 3.0, 4.0]), ("run-2", [0.5])]
    assert "<script>alert(1)</script>" not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    sdk.Experiment("exp-escaped").delete()


def test_artifacts_and_executions_of_a_run_with_their_lineage(sdk):
    from google.cloud.aiplatform.metadata.schema.google import artifact_schema as google_schema
    from google.cloud.aiplatform.metadata.schema.system import artifact_schema as system_schema
    from google.cloud.aiplatform.metadata.schema.system import execution_schema as system_exec

    sdk.init(experiment=EXPERIMENT)
    ds = sdk.Artifact.create(schema_title="system.Dataset", resource_id="flows-dataset", uri="gs://b/ds-uri")
    assert ds.uri == "gs://b/ds-uri"
    found = sdk.Artifact.get_with_uri(uri="gs://b/ds-uri")
    assert (found.name, found.uri) == ("flows-dataset", "gs://b/ds-uri")

    sdk.start_run("run-1", resume=True)
    with sdk.start_execution(schema_title="system.ContainerExecution", resource_id="flows-execution") as execution:
        execution.assign_input_artifacts([sdk.Artifact(artifact_name="flows-dataset")])
        model = sdk.Artifact.create(schema_title="system.Model", uri="gs://b/model")
        execution.assign_output_artifacts([model])
    assert [a.name for a in execution.get_input_artifacts()] == [ds.name]
    assert [a.name for a in execution.get_output_artifacts()] == [model.name]
    run = sdk.ExperimentRun("run-1", experiment=EXPERIMENT)
    assert [e.name for e in run.get_executions()] == ["flows-execution"]
    names = sorted(a.name for a in run.get_artifacts())
    assert names == sorted([ds.name, model.name, run._tensorboard_run_id(run.resource_id)])
    sdk.end_run()

    # The dataset -> execution -> model subgraph, asked of the model (the SDK's gapic client).
    graph = model.api_client.select_version("v1").query_artifact_lineage_subgraph(artifact=model.resource_name)
    assert sorted(a.schema_title for a in graph.artifacts) == ["system.Dataset", "system.Model"]
    assert [e.display_name or e.name.rsplit("/", 1)[-1] for e in graph.executions] == ["flows-execution"]
    assert sorted(e.type_.name for e in graph.events) == ["INPUT", "OUTPUT"]

    # The SDK's schema classes create nodes with their schema titles (test_e2e_metadata_schema).
    made = system_schema.Dataset(uri="gs://b/sds", display_name="sds", metadata={"rows": 3},
                                 description="a system dataset").create()
    assert (made.schema_title, made.display_name, made.metadata["rows"]) == ("system.Dataset", "sds", 3)
    assert "/metadataStores/default/artifacts/" in made.resource_name
    vertex_ds = google_schema.VertexDataset(vertex_dataset_name=f"{PARENT}/datasets/123",
                                            display_name="vds").create()
    assert vertex_ds.schema_title == "google.VertexDataset"
    assert vertex_ds.metadata["resourceName"] == f"{PARENT}/datasets/123"
    job_exec = system_exec.CustomJobExecution(display_name="cj", description="a job").create()
    assert job_exec.schema_title == "system.CustomJobExecution"
    assert "/metadataStores/default/executions/" in job_exec.resource_name


def test_a_run_resumed_after_a_platform_restart_and_deletes(sdk, platform):
    from google.api_core import exceptions

    platform.stop()
    platform.start()
    sdk.init(experiment=EXPERIMENT)
    sdk.start_run("run-2", resume=True)
    sdk.log_metrics({"after-restart": 1.0})
    sdk.end_run()
    assert sdk.ExperimentRun("run-2", experiment=EXPERIMENT).get_metrics()["after-restart"] == 1.0

    # Deleted with its TensorBoard run: the name can be started again.
    run = sdk.ExperimentRun("run-2", experiment=EXPERIMENT)
    tb_run_name = run._backing_tensorboard_run.resource.resource_name
    run.delete(delete_backing_tensorboard_run=True)
    with pytest.raises(exceptions.NotFound):
        sdk.ExperimentRun("run-2", experiment=EXPERIMENT)
    assert requests.get(f"{platform.url}/v1/{tb_run_name}", timeout=10).status_code == 404
    sdk.start_run("run-2")
    sdk.end_run()
    assert sdk.ExperimentRun("run-2", experiment=EXPERIMENT).name == "run-2"

    # Deleted without it: the TensorBoard run and its reference stay, so the name cannot be reused.
    sdk.ExperimentRun("run-2", experiment=EXPERIMENT).delete()
    with pytest.raises(ValueError):
        sdk.start_run("run-2")

    experiment = sdk.Experiment(EXPERIMENT)
    experiment.delete(delete_backing_tensorboard_runs=True)
    with pytest.raises(exceptions.NotFound):
        sdk.Experiment(EXPERIMENT)


def test_tensorboard_resources_and_data_through_the_sdk(sdk):
    tensorboard = STATE["tensorboard"]
    tb_exp = sdk.TensorboardExperiment.create(tensorboard_experiment_id="tb-direct",
                                             tensorboard_name=tensorboard.resource_name, display_name="direct")
    tb_run = sdk.TensorboardRun.create(tensorboard_run_id="r1", tensorboard_experiment_name=tb_exp.resource_name)
    ts = tb_run.create_tensorboard_time_series(display_name="loss")
    for step in range(3):
        tb_run.write_tensorboard_scalar_data({"loss": 1.0 / (step + 1)}, step=step)
    data = tb_run.read_time_series_data()
    assert [p.scalar.value for p in data["loss"].values] == [1.0, 0.5, pytest.approx(1 / 3)]
    assert [ts.display_name for ts in sdk.TensorboardTimeSeries.list(tensorboard_run_name=tb_run.resource_name)] \
        == ["loss"]
    assert [r.name for r in sdk.TensorboardRun.list(tensorboard_experiment_name=tb_exp.resource_name)] == ["r1"]
    assert ts.resource_name.startswith(tb_run.resource_name + "/timeSeries/")
    tb_exp.delete()
    tensorboard.delete()
    assert sdk.Tensorboard.list(filter='display_name="experiments-tb"') == []


def test_log_model_then_register_deploy_and_predict(sdk, gcs_emulator, tmp_path):
    """log_model of a scikit-learn and a TensorFlow model (test_experiment_model's flows); the
    scikit-learn one registered as a Vertex model, deployed and predicting. The TensorFlow model goes to a
    local directory: the SDK has TensorFlow write it itself, and TensorFlow's own gs:// client reaches only
    storage.googleapis.com (it has no endpoint setting for a local Cloud Storage)."""
    import numpy as np
    import tensorflow as tf
    from sklearn.linear_model import LinearRegression

    sdk.init(experiment="exp-models", experiment_tensorboard=False)
    x = np.array([[1, 1], [1, 2], [2, 2], [2, 3]])
    y = np.dot(x, np.array([1, 2])) + 3
    sk = LinearRegression().fit(x, y)
    keras = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
    with sdk.start_run("models"):
        sdk.log_model(model=sk, artifact_id="sk-model", uri=f"gs://{STAGING}/exp-models/sk", input_example=x)
        sdk.log_model(model=keras, artifact_id="tf-model", uri=str(tmp_path / "tf"))
    run = sdk.ExperimentRun("models", experiment="exp-models")
    by_name = {m.name: m for m in run.get_experiment_models()}
    assert sorted(by_name) == ["sk-model", "tf-model"]
    info = by_name["sk-model"].get_model_info()
    assert (info["framework_name"], info["model_class"]) == ("sklearn",
                                                             "sklearn.linear_model._base.LinearRegression")
    assert info["input_example"] == {"type": "numpy.ndarray", "data": x.tolist()}
    assert by_name["tf-model"].get_model_info()["framework_name"] == "tensorflow"
    assert np.allclose(by_name["sk-model"].load_model().predict(x), y)
    loaded = by_name["tf-model"].load_model()
    assert np.allclose(np.asarray(loaded(x.astype("float32"))), keras(x.astype("float32")).numpy(), atol=1e-5)
    same = sdk.get_experiment_model("sk-model")
    assert same.uri == f"gs://{STAGING}/exp-models/sk"

    # The SDK picks a prebuilt image by the model's scikit-learn version and refuses one newer than its
    # images (1.6): this environment's is newer, so the image is named, as the SDK's message advises.
    model = by_name["sk-model"].register_model(
        display_name="from-experiment",
        serving_container_image_uri="us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-5:latest")
    endpoint = model.deploy()
    try:
        assert np.allclose(endpoint.predict(instances=x.tolist()).predictions, y)
    finally:
        endpoint.undeploy_all()
        endpoint.delete()


def test_upload_tb_log_sends_event_files_read_back_by_batch_read(sdk, tmp_path):
    """The SDK's uploader (aiplatform.upload_tb_log) reads a training's TensorBoard event files and sends
    their scalars; batchRead (TensorboardRun.read_time_series_data) returns them."""
    import tensorflow as tf

    for run, scale in (("train", 1.0), ("validation", 2.0)):
        with tf.summary.create_file_writer(str(tmp_path / run)).as_default():
            for step in range(4):
                tf.summary.scalar("loss", scale / (step + 1), step=step)
    board = sdk.Tensorboard.create(display_name="uploads")
    sdk.upload_tb_log(tensorboard_id=board.name, tensorboard_experiment_name="uploaded", logdir=str(tmp_path))
    runs = sdk.TensorboardRun.list(tensorboard_experiment_name=f"{board.resource_name}/experiments/uploaded")
    read = {r.name: [p.scalar.value for p in r.read_time_series_data()["loss"].values] for r in runs}
    assert read == {"train": pytest.approx([1.0, 1 / 2, 1 / 3, 1 / 4]),
                    "validation": pytest.approx([2.0, 2 / 2, 2 / 3, 2 / 4])}
    board.delete()
