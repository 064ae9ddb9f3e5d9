"""Vertex AI Experiments through the stock SDK against the session platform: what Google's system
tests (tests/system/aiplatform/test_experiments.py, test_e2e_metadata_schema.py, test_tensorboard.py
of googleapis/python-aiplatform) do, as our own flows. The tests of this module run in order and
share one experiment (their module state), as Google's class does."""
from __future__ import annotations

import pandas as pd
import pytest
import requests

from tests.platform.conftest import PARENT, STAGING_BUCKET as STAGING
from tests.platform.jobs_helpers import aiplatform, experiments_sdk  # noqa: F401  (the module's SDK fixtures)

EXPERIMENT = "exp-flows"
PARAMS = {"sdk-param-test-1": 0.1, "sdk-param-test-2": 0.2}
METRICS = {"sdk-metric-test-1": 0.8, "sdk-metric-test-2": 100.0}
PARAMS_2 = {"sdk-param-test-1": 0.2, "sdk-param-test-2": 0.4}
METRICS_2 = {"sdk-metric-test-1": 1.6, "sdk-metric-test-2": 200.0}
CLASSIFICATION = {"display_name": "my-classification-metrics", "labels": ["cat", "dog"],
                  "matrix": [[9, 1], [1, 9]], "fpr": [0.1, 0.5, 0.9], "tpr": [0.1, 0.7, 0.9],
                  "threshold": [0.9, 0.5, 0.1]}
STATE: dict = {}


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
    """log_model of a scikit-learn, an XGBoost and a TensorFlow model (test_experiment_model's flows); the
    scikit-learn one registered as a Vertex model, deployed and predicting. The TensorFlow model goes to a
    local directory: the SDK has TensorFlow write it itself, and TensorFlow's own gs:// client reaches only
    storage.googleapis.com (it has no endpoint setting for a local Cloud Storage)."""
    import numpy as np
    import tensorflow as tf
    import xgboost
    from sklearn.linear_model import LinearRegression

    sdk.init(experiment="exp-models", experiment_tensorboard=False)
    x = np.array([[1, 1], [1, 2], [2, 2], [2, 3]])
    y = np.dot(x, np.array([1, 2])) + 3
    sk = LinearRegression().fit(x, y)
    keras = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
    xgb = xgboost.XGBRegressor(n_estimators=5, max_depth=2).fit(x, y)
    with sdk.start_run("models"):
        sdk.log_model(model=sk, artifact_id="sk-model", uri=f"gs://{STAGING}/exp-models/sk", input_example=x)
        sdk.log_model(model=keras, artifact_id="tf-model", uri=str(tmp_path / "tf"))
        sdk.log_model(model=xgb, artifact_id="xgb-model", uri=f"gs://{STAGING}/exp-models/xgb")
    run = sdk.ExperimentRun("models", experiment="exp-models")
    by_name = {m.name: m for m in run.get_experiment_models()}
    assert sorted(by_name) == ["sk-model", "tf-model", "xgb-model"]
    assert by_name["xgb-model"].get_model_info()["framework_name"] == "xgboost"
    assert np.allclose(by_name["xgb-model"].load_model().predict(x), xgb.predict(x))
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


JOB_SCRIPT = """from google.cloud import aiplatform
aiplatform.log_params({"lr": 0.1, "layers": 2})
aiplatform.log_metrics({"accuracy": 0.9})
"""


def test_custom_jobs_record_into_their_experiment_run_and_tensorboard(sdk, platform, tmp_path):
    """CustomJob.run(experiment=, experiment_run=) (test_custom_job's experiment flows): the job's SDK finds its
    run through Vertex's AIP_EXPERIMENT_NAME / AIP_EXPERIMENT_RUN_NAME; a job naming only the experiment gets a
    run made for it, named in its jobSpec; the SDK ends both runs when the jobs end. CustomJob.run(tensorboard=):
    the job's AIP_TENSORBOARD_LOG_DIR event files become TensorBoard experiment {job id} of that resource, a run
    per folder, as Vertex uploads them. The three jobs run at once."""
    store = f"{PARENT}/metadataStores/default"
    sdk.init(experiment="exp-jobs", experiment_tensorboard=False)
    script = tmp_path / "train.py"
    script.write_text(JOB_SCRIPT)
    tb_script = tmp_path / "tb" / "train.py"
    tb_script.parent.mkdir()
    tb_script.write_text(TB_SCRIPT)
    board = sdk.Tensorboard.create(display_name="job-logs")
    tb_job = sdk.CustomJob.from_local_script(display_name="tb-job", script_path=str(tb_script),
                                             container_uri="us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-12:latest",
                                             staging_bucket=f"gs://{STAGING}/tb-job")
    tb_job.run(tensorboard=board.resource_name, sync=False)
    given = sdk.ExperimentRun.create("given", experiment="exp-jobs")
    # A prebuilt training image: the SDK sends a python_package_spec (a custom image would have the job run
    # `pip install --upgrade pip` first).
    jobs = [sdk.CustomJob.from_local_script(display_name=f"exp-job-{i}", script_path=str(script),
                                            container_uri="us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-12:latest",
                                            staging_bucket=f"gs://{STAGING}/exp-jobs")
            for i in range(2)]
    jobs[0].run(experiment="exp-jobs", experiment_run=given, sync=False)
    jobs[1].run(experiment="exp-jobs", sync=False)
    for job in [*jobs, tb_job]:
        job.wait()
    assert jobs[0].job_spec.experiment_run == f"{store}/contexts/exp-jobs-given"
    made = jobs[1].job_spec.experiment_run
    assert made.startswith(f"{store}/contexts/exp-jobs-custom-job-")
    df = sdk.get_experiment_df(include_time_series=False)
    rows = {r["run_name"]: r for r in df.to_dict("records")}
    assert sorted(rows) == sorted(["given", made.rsplit("/contexts/exp-jobs-", 1)[1]])
    for row in rows.values():
        assert (row["state"], row["param.lr"], row["param.layers"], row["metric.accuracy"]) == (
            "COMPLETE", 0.1, 2, 0.9)

    # Refused at create, in Google's format: an experiment that does not exist, a run without its experiment,
    # a run of another experiment.
    sdk.Experiment.create(experiment_name="exp-other")
    pool = {"replicaCount": "1", "containerSpec": {"imageUri": "python", "command": ["true"]}}
    for spec, status, words in (
            ({"experiment": f"{store}/contexts/no-such-exp"}, 404, "does not exist"),
            ({"experimentRun": f"{store}/contexts/exp-jobs-given"}, 400, "only be set with"),
            ({"experiment": f"{store}/contexts/exp-other", "experimentRun": f"{store}/contexts/exp-jobs-given"},
             400, "is not a run of experiment")):
        answer = requests.post(platform.api("customJobs"), timeout=30, json={
            "displayName": "refused", "jobSpec": {"workerPoolSpecs": [pool], **spec}})
        assert answer.status_code == status and words in answer.json()["error"]["message"], answer.text

    runs = sdk.TensorboardRun.list(tensorboard_experiment_name=tb_job.name, tensorboard_id=board.name)
    read = {r.name: [(p.step, p.scalar.value) for p in r.read_time_series_data()["epoch_loss"].values] for r in runs}
    assert read == {"train": [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))],
                    "validation": [(0, 2.0), (1, 1.0), (2, pytest.approx(2 / 3))]}
    for spec, status in (({"tensorboard": f"{PARENT}/tensorboards/404"}, 404),
                         ({"tensorboard": board.resource_name, "experiment": f"{store}/contexts/exp-jobs"}, 400)):
        answer = requests.post(platform.api("customJobs"), timeout=30, json={
            "displayName": "refused", "jobSpec": {"workerPoolSpecs": [pool], **spec}})
        assert answer.status_code == status, answer.text
    board.delete()


def test_autolog_records_a_keras_and_a_scikit_learn_fit_into_runs_it_makes(sdk):
    """aiplatform.autolog() (the SDK's MLflow plugin, test_autologging's flows): each fit gets a run of its
    own, named by its framework, with the fit's parameters and metrics; Keras's epochs as time series. (The
SDK's MLflow, mlflow<=2.16, is installed by scripts/test without its pins: see there.)"""
    import os
    import tempfile

    import numpy as np
    import tensorflow as tf
    from sklearn.linear_model import Ridge

    board = sdk.Tensorboard.create(display_name="autolog-tb")  # autolog() needs the experiment's TensorBoard
    sdk.init(experiment="exp-autolog", experiment_tensorboard=board)
    x = np.random.default_rng(0).random((64, 3)).astype("float32")
    y = (x[:, 0] > 0.5).astype("float32")
    temp_mode = os.stat(tempfile.gettempdir()).st_mode
    sdk.autolog()
    try:
        # A regressor: for a classifier MLflow also logs plots, and the SDK's plugin gives every run the
        # artifact URI file:///tmp/ (hard-coded), so MLflow's copytree into /tmp copies its temp dir's mode
        # 0700 onto /tmp when run as root (docs/metadata.md says so); the check below catches that.
        Ridge(alpha=0.5).fit(x, x @ np.array([1.0, 2.0, 3.0], dtype="float32"))
        model = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer="sgd", loss="binary_crossentropy")
        model.fit(x, y, epochs=3, batch_size=16, verbose=0)
    finally:
        sdk.autolog(disable=True)
    rows = {r["run_name"].split("-", 1)[0]: r for r in sdk.get_experiment_df().to_dict("records")}
    assert sorted(rows) == ["sklearn", "tensorflow"]
    sk, keras = rows["sklearn"], rows["tensorflow"]
    assert os.stat(tempfile.gettempdir()).st_mode == temp_mode  # autolog left the machine's temp dir as it was
    assert (sk["state"], float(sk["param.alpha"]), sk["metric.training_r2_score"] > 0.9) == ("COMPLETE", 0.5, True)
    assert (keras["state"], int(keras["param.epochs"]), int(keras["param.batch_size"])) == ("COMPLETE", 3, 16)
    series = sdk.ExperimentRun(keras["run_name"], experiment="exp-autolog").get_time_series_data_frame()
    # The plugin logs MLflow's step 0 (the first epoch) as a summary metric, the later epochs as time series.
    # (MLflow's async queue may log epochs 1 and 2 at once; both create the run's 'loss' series and the second
    # create is refused, as display names are unique per run: that epoch's point is lost in the client.)
    assert set(series["step"]) in ({1, 2}, {2}, {1}) and keras["time_series_metric.loss"] == series["loss"].iloc[-1]
    board.delete()


def test_a_modelyard_tune_study_recorded_as_an_experiment(sdk, platform, tmp_path):
    """`modelyard tune --experiment`: one run per trial, with the trial's parameters, final metric and state,
    read back through the stock SDK as any experiment's runs are."""
    import yaml

    from tests.tuning.conftest import TRIALS, run, trials, write_study

    xy = [{"parameter_id": p, "double_value_spec": {"min_value": -1, "max_value": 1}} for p in ("x", "y")]
    study = write_study(tmp_path, "Quad_Study", xy, "unused.py", max_trial_count=4, parallel_trial_count=2, seed=0)
    body = yaml.safe_load(study.read_text())
    body["trial"] = {"function": f"{TRIALS / 'objectives.py'}:quadratic", "env": {"OBJECTIVE_LOG": str(tmp_path / "log")}}
    study.write_text(yaml.safe_dump(body, sort_keys=False))
    done = run(["tune", str(study), "--devices", "cpu:0,1", "--experiment", "exp-tune", "--platform", platform.url],
               timeout=300)
    assert done.returncode == 0, done.stdout
    expected = {f"quad-study-trial-{t.number + 1}": (t.params, t.value) for t in trials(study)}
    rows = {r["run_name"]: r for r in sdk.get_experiment_df("exp-tune").to_dict("records")}
    assert sorted(rows) == sorted(expected) and len(rows) == 4
    for name, (params, value) in expected.items():
        row = rows[name]
        assert (row["state"], row["param.x"], row["param.y"]) == ("COMPLETE", params["x"], params["y"])
        assert row["metric.score"] == pytest.approx(value)

    # A platform that cannot take the experiment stops the study before it starts, saying why.
    refused = run(["tune", str(study), "--experiment", "Not_An_Id", "--platform", platform.url], timeout=120)
    assert refused.returncode == 2 and "must match [a-z0-9]" in refused.stdout


def test_a_tuning_jobs_trials_are_runs_of_its_experiment(sdk, platform):
    """A HyperparameterTuningJob whose trialJobSpec names an experiment: each trial a run of it."""
    import sys
    import time

    from tests.tuning.conftest import TRIALS

    store = f"{PARENT}/metadataStores/default"
    sdk.Experiment.create(experiment_name="exp-hpt")
    body = {"displayName": "hpt-exp", "maxTrialCount": 2, "parallelTrialCount": 1,
            "studySpec": {"metrics": [{"metricId": "score", "goal": "MAXIMIZE"}],
                          "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}},
                                         {"parameterId": "units", "discreteValueSpec": {"values": [32, 64]}}]},
            "trialJobSpec": {"experiment": f"{store}/contexts/exp-hpt", "workerPoolSpecs": [{
                "replicaCount": "1", "containerSpec": {"imageUri": "x", "args": ["--epochs=1"], "command": [
                    sys.executable, str(TRIALS / "hypertune_quadratic.py")]}}]}}
    for spec, status in (({"experiment": f"{store}/contexts/no-such"}, 404),
                         ({"experimentRun": f"{store}/contexts/exp-hpt-x"}, 400)):
        refused = {**body, "trialJobSpec": {**body["trialJobSpec"], **spec}}
        assert requests.post(platform.api("hyperparameterTuningJobs"), json=refused, timeout=30).status_code == status
    job = requests.post(platform.api("hyperparameterTuningJobs"), json=body, timeout=30).json()
    url = f"{platform.url}/v1/{job['name']}"
    deadline = time.monotonic() + 240
    while (job := requests.get(url, timeout=10).json())["state"] not in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"):
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    rows = {r["run_name"]: r for r in sdk.get_experiment_df("exp-hpt").to_dict("records")}
    prefix = f"hpt-{job['name'].rsplit('/', 1)[1]}-trial-"
    assert sorted(rows) == [f"{prefix}1", f"{prefix}2"]
    for trial in job["trials"]:
        row = rows[prefix + trial["id"]]
        params = {p["parameterId"]: p["value"] for p in trial["parameters"]}
        assert (row["state"], row["param.x"], row["param.units"]) == ("COMPLETE", params["x"], params["units"])
        assert row["metric.score"] == pytest.approx(trial["finalMeasurement"]["metrics"][0]["value"])


TB_SCRIPT = """import os
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

for run, scale in (("train", 1.0), ("validation", 2.0)):
    writer = EventFileWriter(os.path.join(os.environ["AIP_TENSORBOARD_LOG_DIR"], run))
    for step in range(3):
        value = summary_pb2.Summary.Value(tag="epoch_loss", simple_value=scale / (step + 1))
        writer.add_event(event_pb2.Event(step=step, wall_time=1.7e9 + step, summary=summary_pb2.Summary(value=[value])))
    writer.close()
"""


def test_tensorflow_scalar_summaries_are_read_from_event_files(tmp_path):
    """TF2's tf.summary.scalar writes a scalar tensor, not a simple_value: both are read (one layer down)."""
    import tensorflow as tf

    from modelyard.platform.jobs import tensorboard_upload

    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        for step in range(3):
            tf.summary.scalar("loss", 1.0 / (step + 1), step=step)
            tf.summary.text("note", "not a scalar", step=step)
    found = tensorboard_upload.read_scalars(sorted(tmp_path.glob("*tfevents*")))
    assert list(found) == ["loss"]
    assert [(s, v) for s, _w, v in found["loss"]] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]


def test_resource_manager_answers_a_project_number(platform):
    """Cloud Resource Manager's projects.get, which Google's e2e_base (its staging bucket) and the SDK's
    resource_manager_utils ask: the stock client over REST, its host the platform's."""
    import google.auth.credentials
    from google.cloud import resourcemanager

    from modelyard.platform.api.project_numbers import project_number

    client = resourcemanager.ProjectsClient(credentials=google.auth.credentials.AnonymousCredentials(),
                                            transport="rest", client_options={"api_endpoint": platform.url})
    project = client.get_project(name="projects/local")
    assert (project.project_id, project.name) == ("local", f"projects/{project_number('local')}")
