"""Issue 17, several hosts: ``modelyard platform --engine ray`` runs a CustomJob's replicas as Ray
actors on the shared two-node Ray cluster (tests/ray_cluster.py, one CPU per node).

A chief and a worker land on the two nodes (the node ids their actors gave them), with one TF_CONFIG
cluster of the nodes' addresses and ports reserved there (each replica can bind its own), their own
task types and indexes, and the job's log holding both replicas' lines. A failing worker fails the
job with its last lines; cancelling a sleeping job stops every replica, and no actor or process is left;
nor when the job's own process is killed.
No TensorFlow runs here: the replicas are a tiny script (job_scripts/node_probe.py).

The second node sees none of this host's temp dirs (tests/ray_cluster.py): a local base output
directory is written on each node and copied back when its replica ends, so the probes' records are
read once the job is over, and the pids of running replicas come from the job's log. Issue 31,
must-show 3: a CustomTrainingJob (the stock SDK, its script as a package in storage) with a chief and
a worker on the two nodes writes its model to AIP_MODEL_DIR (gs://), and the Model it uploads
deploys; a job whose node is killed fails naming that node. Issue 44: each replica finds its project
and credentials (``google.auth.default()``) from a metadata server its node runs for it, and the chief
copies the model with TensorFlow's own ``tf.io.gfile`` through its node's storage gateway.
A HyperparameterTuningJob's trials (the stock SDK's) are jobs placed on the nodes as a CustomJob's
replicas are: each trial's process records the Ray node its actor gave it, reports its metric with
``cloudml-hypertune`` on the node's disk, and the SDK reads the trials' measurements back and finds
them as runs of the trials' experiment.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.platform.conftest import PARENT, STAGING_BUCKET
from tests.platform.ray_platform import running
from tests.platform.jobs_helpers import (aiplatform, alive, experiments_sdk, job_processes,  # noqa: F401
                                         no_stray_jobs, wait_gone, wait_state)
from tests.ray_cluster import ask_driver, ensure_nodes, session_cluster

PROBE = str(Path(__file__).with_name("job_scripts") / "node_probe.py")
TRAIN = str(Path(__file__).with_name("job_scripts") / "train_gcs.py")
TRIAL = str(Path(__file__).with_name("job_scripts") / "trial_node.py")
TRAIN_IMAGE = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-12.py310:latest"
SERVE_IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-12:latest"
STARTED = re.compile(r"(\w+:\d+) \| \[modelyard\] started pid (\d+) on Ray node (\w+) \(([^)]+)\)")
FINAL = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
TIMEOUT_S = 240  # a job joins Ray and starts two actors on a busy 2-core machine

# This job's live actors and the alive nodes' addresses, asked through the session's driver (ask_driver:
# pytest never becomes one).
_RAY_SCRIPT = """
import json, sys, ray
ray.init(address=sys.argv[1], namespace="modelyard", logging_level="ERROR", log_to_driver=False)
prefix = "modelyard-job-" + sys.argv[2] + "-"
print(RESULT + json.dumps({"actors": [n for n in ray.util.list_named_actors() if n.startswith(prefix)],
                  "nodes": {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}}))
"""


@pytest.fixture(scope="module")
def platform(ray_platform):
    """The session's platform on the Ray cluster (tests/platform/conftest.py; this overrides the session's
    local one: jobs_helpers' no_stray_jobs watches it), serving its Cloud Storage over the session storage's root."""
    return running(ray_platform)


def _pool(args: list[str], gpus: int = 0) -> dict:
    return {"machineSpec": {"machineType": "n1-standard-4", "acceleratorCount": gpus}, "replicaCount": "1",
            "containerSpec": {"imageUri": "x", "command": [sys.executable, PROBE], "args": args}}


def _submit(platform, name: str, out: Path, chief: list[str], worker: list[str], worker_gpus: int = 0) -> str:
    body = {"displayName": name, "jobSpec": {"workerPoolSpecs": [_pool(chief), _pool(worker, worker_gpus)],
                                             "baseOutputDirectory": {"outputUriPrefix": str(out)}}}
    r = requests.post(platform.api("customJobs"), json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["name"]


def _seen(out: Path, timeout: float = TIMEOUT_S) -> dict:
    """What each replica recorded, once both have."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted((out / "model").glob("*.json"))
        if len(files) == 2:
            try:
                return {f.stem: json.loads(f.read_text()) for f in files}
            except ValueError:  # being written
                pass
        time.sleep(0.2)
    raise AssertionError(f"the replicas did not both start: {list((out / 'model').glob('*'))}")


def _started(platform, name: str, count: int = 2, timeout: float = TIMEOUT_S) -> dict[str, dict]:
    """``{task: {"pid", "node", "host"}}`` of the job's running replicas, from its log (their records
    are on their nodes until they end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {m[0]: {"pid": int(m[1]), "node": m[2], "host": m[3]} for m in STARTED.findall(_log(platform, name))}
        if len(found) >= count:
            return found
        time.sleep(0.3)
    raise AssertionError(f"the replicas did not both start: {_log(platform, name)[-3000:]}")


def _ask_ray(address: str, name: str) -> dict:
    return ask_driver(_RAY_SCRIPT, address, name.rsplit("/", 1)[-1])


def _actors(address: str, name: str) -> list[str]:
    return _ask_ray(address, name)["actors"]


def _log(platform, name: str) -> str:
    return requests.get(f"{platform.url}/modelyard/v1/jobs/{name.rsplit('/', 1)[-1]}/logs", timeout=10).text


def test_chief_and_worker_run_on_two_nodes_with_one_cluster(platform, ray_cluster, tmp_path):
    name = _submit(platform, "on-ray", tmp_path, ["--sleep=1"], ["--sleep=1"])
    job = wait_state(platform, name, FINAL, TIMEOUT_S)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    seen = _seen(tmp_path, 5)
    chief, worker = seen["chief-0"], seen["worker-0"]
    ray_now = _ask_ray(ray_cluster, name)
    nodes = ray_now["nodes"]
    assert chief["node_id"] in nodes and worker["node_id"] in nodes, nodes
    assert chief["node_id"] != worker["node_id"]  # SPREAD, one CPU each: one replica per node
    cluster = chief["tf_config"]["cluster"]
    assert worker["tf_config"]["cluster"] == cluster and sorted(cluster) == ["chief", "worker"]
    assert chief["tf_config"]["task"] == {"type": "chief", "index": 0}
    assert worker["tf_config"]["task"] == {"type": "worker", "index": 0}
    # Each replica's address is its node's, as Ray reports it, with a port reserved on that node until
    # the replica started: each could bind its own.
    addresses = cluster["chief"] + cluster["worker"]
    assert [a.rsplit(":", 1)[0] for a in addresses] == [nodes[chief["node_id"]], nodes[worker["node_id"]]]
    assert len(set(addresses)) == 2
    assert chief["bindable"] and worker["bindable"]
    assert chief["cluster_spec"]["task"] == {"type": "workerpool0", "index": 0}
    assert worker["cluster_spec"]["task"] == {"type": "workerpool1", "index": 0}
    assert chief["job_id"] == worker["job_id"] == name.rsplit("/", 1)[-1]
    log = _log(platform, name)
    for task, who in (("chief:0", chief), ("worker:0", worker)):
        assert f"{task} | [modelyard] started pid {who['pid']} on Ray node {who['node_id'][:12]}" in log, log
        assert f"{task} | {task.replace(':', '-')} on node {who['node_id']}" in log, log
        # Written on its node (under the node's own scratch dir), copied back into the local output.
        assert f"{task} | [modelyard] copied 1 output file(s) from the node to {tmp_path}" in log, log
    assert ray_now["actors"] == []


def test_a_failing_worker_fails_the_job_with_its_last_lines(platform, ray_cluster, tmp_path):
    name = _submit(platform, "fails-on-ray", tmp_path, ["--sleep=300"], ["--sleep=1", "--fail=3"])
    job = wait_state(platform, name, FINAL, TIMEOUT_S)
    assert job["state"] == "JOB_STATE_FAILED", job
    message = job["error"]["message"]
    assert "task worker:0 exited with code 3" in message and "worker-0: failing on purpose" in message, message
    chief = _started(platform, name, 2, 5)["chief:0"]
    assert not alive(chief["pid"])  # the chief was stopped when the worker failed
    assert wait_gone(platform) == [] and _actors(ray_cluster, name) == []


def test_cancel_stops_every_replica_and_actor(platform, ray_cluster, tmp_path):
    name = _submit(platform, "cancel-on-ray", tmp_path, ["--sleep=300"], ["--sleep=300"])
    pids = [v["pid"] for v in _started(platform, name).values()]
    assert all(alive(pid) for pid in pids)
    assert len(_actors(ray_cluster, name)) == 2
    r = requests.post(f"{platform.url}/v1/{name}:cancel", timeout=30)
    assert r.status_code == 200, r.text
    job = wait_state(platform, name, FINAL, TIMEOUT_S)
    assert job["state"] == "JOB_STATE_CANCELLED", job
    assert not [pid for pid in pids if alive(pid)]
    assert wait_gone(platform) == [] and _actors(ray_cluster, name) == []
    assert requests.get(f"{platform.url}/healthz", timeout=5).text == "ok"


def test_replicas_do_not_outlive_a_killed_job_process(platform, ray_cluster, tmp_path):
    # The job's own process (the actors' owner) dies: Ray ends its actors, and each replica dies with its actor.
    name = _submit(platform, "crash-on-ray", tmp_path, ["--sleep=300"], ["--sleep=300"])
    pids = [v["pid"] for v in _started(platform, name).values()]
    child = [p for p in job_processes(platform) if b"job_child" in open(f"/proc/{p}/cmdline", "rb").read()]
    assert len(child) == 1
    os.kill(child[0], signal.SIGKILL)
    job = wait_state(platform, name, FINAL, TIMEOUT_S)
    assert job["state"] == "JOB_STATE_FAILED" and "killed by signal 9" in job["error"]["message"], job
    deadline = time.monotonic() + 60
    while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if alive(pid)]
    assert wait_gone(platform) == [] and _actors(ray_cluster, name) == []


def test_a_replica_no_node_can_take_fails_the_job_at_once(platform, ray_cluster, tmp_path):
    name = _submit(platform, "gpu-on-ray", tmp_path, ["--sleep=1"], ["--sleep=1"], worker_gpus=1)
    job = wait_state(platform, name, FINAL, TIMEOUT_S)  # not after the 300 s placement wait
    assert job["state"] == "JOB_STATE_FAILED", job
    assert job["error"]["code"] == 9, job  # FAILED_PRECONDITION
    assert "no node of the Ray cluster has 1 CPU(s) and 1 GPU(s) for a worker replica" in job["error"]["message"]
    assert "1 CPU, 0 GPU" in job["error"]["message"]
    assert not (tmp_path / "model").exists() or not list((tmp_path / "model").glob("*.json"))  # nothing ran
    assert _actors(ray_cluster, name) == []
    assert requests.get(f"{platform.url}/healthz", timeout=5).text == "ok"


def test_custom_training_job_on_two_nodes_writes_a_model_that_deploys(platform, aiplatform, gcs_emulator,
                                                                       ray_cluster, tiny_models):
    """Must-show 3: the SDK's script package reaches each node through storage, the chief and the
    worker run on different nodes, the chief writes AIP_MODEL_DIR (gs://) and the Model deploys."""
    from google.cloud import storage

    bucket = gcs_emulator["client"].bucket(STAGING_BUCKET)
    tiny = tiny_models["models"]["tiny1"]
    source = Path(tiny["path"])
    for f in sorted(p for p in source.rglob("*") if p.is_file()):  # the "training data": only in storage
        bucket.blob(f"ray-train/source/{f.relative_to(source).as_posix()}").upload_from_filename(str(f))
    job = aiplatform.CustomTrainingJob(display_name="ray-train", script_path=TRAIN, container_uri=TRAIN_IMAGE,
                                       model_serving_container_image_uri=SERVE_IMAGE)
    model = job.run(args=["--epochs=1"], replica_count=2, sync=True,
                    environment_variables={"SOURCE_MODEL": f"gs://{STAGING_BUCKET}/ray-train/source"})
    pipeline = job.gca_resource
    assert pipeline.state.name == "PIPELINE_STATE_SUCCEEDED"
    backing = pipeline.training_task_metadata["backingCustomJob"]
    base = pipeline.training_task_inputs["base_output_directory"]["output_uri_prefix"].rstrip("/")
    assert model.uri.rstrip("/") == f"{base}/model"

    def record(task: str) -> dict:
        blob = storage.Blob.from_uri(f"{base}/checkpoints/{task}.json", client=gcs_emulator["client"])
        return json.loads(blob.download_as_text())

    chief, worker = record("workerpool0-0"), record("workerpool1-0")
    assert chief["node_id"] != worker["node_id"], "one replica per node"
    for seen in (chief, worker):
        assert seen["env"]["AIP_MODEL_DIR"] == f"{base}/model/"
        assert "/modelyard-jobs/" in seen["python"] and "/venv/" in seen["python"], seen  # the node's own venv
        assert seen["cwd"].startswith(str(Path(seen["python"]).parents[2])), seen
        # Issue 44 on a Ray node: its own metadata server (google.auth.default(), a storage.Client() given
        # nothing) and storage gateway, as a local job's processes have theirs.
        assert seen["project"] == seen["env"]["CLOUD_ML_PROJECT_ID"] == "local", seen["env"]
        assert seen["credentials"] == "Credentials" and seen["token"], seen
        assert seen["env"]["GCE_METADATA_HOST"].startswith("127.0.0.1:"), seen
        assert seen["env"]["STORAGE_EMULATOR_HOST"] == "http://" + seen["env"]["GCE_METADATA_HOST"], seen
        assert seen["env"]["HTTPS_PROXY"].startswith("http://127.0.0.1:"), seen
    written = sorted(b.name for b in bucket.client.list_blobs(STAGING_BUCKET, prefix=base.split("/", 3)[3] + "/model/"))
    assert any(n.endswith("saved_model.pb") for n in written), written
    log = _log(platform, backing)
    assert "chief:0 | workerpool0-0: wrote" in log and "with tf.io.gfile" in log, log  # TensorFlow's own gs://
    nodes = {m[0]: m[2] for m in STARTED.findall(log)}
    assert set(nodes) == {"chief:0", "worker:0"} and nodes["chief:0"] != nodes["worker:0"], log

    endpoint = model.deploy(machine_type="n1-standard-4", min_replica_count=1, max_replica_count=1)
    try:
        got = endpoint.predict(instances=np.array(tiny_models["instances"], np.float32).tolist())
        np.testing.assert_allclose(got.predictions, tiny["predictions"], rtol=1e-5, atol=1e-6)
    finally:
        endpoint.undeploy_all()
        endpoint.delete()
    model.delete()


def test_a_job_whose_node_dies_fails_naming_it(platform, ray_cluster, tmp_path):
    cluster = session_cluster()
    ensure_nodes(cluster, 2)
    name = _submit(platform, "node-dies", tmp_path, ["--sleep=300"], ["--sleep=300"])
    started = _started(platform, name)
    (worker_node,) = cluster.workers()
    dying = cluster.node_id(worker_node)
    (task,) = [t for t, who in started.items() if dying.startswith(who["node"])]
    cluster.kill_node(worker_node)
    try:
        job = wait_state(platform, name, FINAL, TIMEOUT_S)
        assert job["state"] == "JOB_STATE_FAILED", job
        message = job["error"]["message"]
        assert f"task {task} exited with code -9 (killed by SIGKILL)" in message, message
        # The node's address as Ray knows it (127.0.0.1, or this host's own address when Ray picks that).
        assert re.search(rf"\[modelyard\] Ray node {dying[:12]} \([0-9.]+\) is gone", message), message
        assert not [who["pid"] for who in started.values() if alive(who["pid"])]
        assert _actors(ray_cluster, name) == []
    finally:
        ensure_nodes(cluster, 2)


def test_tuning_trials_run_on_ray_nodes(platform, sdk, ray_cluster, tmp_path):
    """Each trial is a job on a Ray node (tuning_jobs.engine_trials -> trial_job -> custom_jobs.run_pools):
    its process has the node id its actor gave it, works in the node's scratch directory (where its
    hypertune file is written), its measurements reach the trial through the SDK, and each trial is
    a run of the experiment the trial job spec names, with its parameter and final metric."""
    from google.cloud.aiplatform import hyperparameter_tuning as hpt
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state
    from google.cloud.aiplatform.compat.types import study as gca_study

    sdk.Experiment.create(experiment_name="ray-hpt")
    custom = sdk.CustomJob(display_name="trial", base_output_dir=str(tmp_path), worker_pool_specs=[{
        "machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
        "container_spec": {"image_uri": "us-docker.pkg.dev/p/trainer:1", "command": [sys.executable, TRIAL]}}])
    # Vertex's CustomJobSpec.experiment; the SDK copies the job spec into the trial job spec.
    custom.job_spec.experiment = f"{PARENT}/metadataStores/default/contexts/ray-hpt"
    job = sdk.HyperparameterTuningJob(
        display_name="trials-on-ray", custom_job=custom, metric_spec={"score": "maximize"},
        parameter_spec={"x": hpt.DoubleParameterSpec(min=0.0, max=1.0, scale="linear")},
        max_trial_count=2, parallel_trial_count=2)
    job.run(sync=True)
    assert job.state == gca_job_state.JobState.JOB_STATE_SUCCEEDED, _log(platform, job.resource_name)[-3000:]
    ray_now = _ask_ray(ray_cluster, job.resource_name)
    trials = job.trials
    assert [t.id for t in trials] == ["1", "2"]
    for t in trials:
        assert t.state == gca_study.Trial.State.SUCCEEDED
        x = t.parameters[0].value
        assert t.final_measurement.metrics[0].value == pytest.approx(1.0 - (x - 0.3) ** 2, abs=1e-9)
        assert [m.step_count for m in t.measurements] == [1, 2]
        trial_dir = tmp_path / f"trial-{int(t.id):04d}"
        where = json.loads((trial_dir / "model" / "where.json").read_text())  # copied back from its node
        assert where["trial"] == t.id and where["node_id"] in ray_now["nodes"], (where, ray_now)
        # On the node's own disk (a scratch dir of its actor), not in the platform's trial directory.
        assert "/modelyard-jobs/job-" in where["cwd"] and where["metric_file"].startswith(where["cwd"]), where
        log = (trial_dir / "trial.log").read_text()
        assert f"[modelyard] started pid {where['pid']} on Ray node {where['node_id'][:12]}" in log, log
    assert ray_now["actors"] == []  # every trial's actor ended with it (named modelyard-job-<job id>-trial-...)
    rows = {r["run_name"]: r for r in sdk.get_experiment_df("ray-hpt").to_dict("records")}
    prefix = f"hpt-{job.resource_name.rsplit('/', 1)[1]}-trial-"
    assert sorted(rows) == [f"{prefix}1", f"{prefix}2"]
    for t in trials:
        row = rows[prefix + t.id]
        assert (row["state"], row["param.x"]) == ("COMPLETE", t.parameters[0].value)
        assert row["metric.score"] == pytest.approx(t.final_measurement.metrics[0].value)

