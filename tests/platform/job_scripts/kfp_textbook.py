"""The textbook's steps as a KFP v2 pipeline of Google Cloud Pipeline Components (test_pipeline_jobs.py
compiles it): a CustomTrainingJobOp whose worker puts a SavedModel in its model directory (a copy of a
tiny model: the training itself is tested elsewhere), an importer of that directory as an unmanaged
container model, ModelUploadOp, EndpointCreateOp, ModelDeployOp and ModelBatchPredictOp. No ``from
__future__ import annotations``: kfp reads the components' annotations as types."""
from google_cloud_pipeline_components.types import artifact_types
from google_cloud_pipeline_components.v1.batch_predict_job import ModelBatchPredictOp
from google_cloud_pipeline_components.v1.custom_job import CustomTrainingJobOp
from google_cloud_pipeline_components.v1.endpoint import EndpointCreateOp, ModelDeployOp
from google_cloud_pipeline_components.v1.model import ModelUploadOp
from kfp import dsl

COPY = "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True)"
IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-12:latest"


def textbook(trained_model: str, job_dir: str, instances: str, predictions: str):
    """The pipeline: the model copied from ``trained_model`` (a local SavedModel directory) by the
    training job into ``{job_dir}/model`` (a gs:// directory), served and batch-predicted over
    ``instances`` (a gs:// JSONL file) into ``predictions``."""
    model_dir = f"{job_dir}/model"

    @dsl.pipeline(name="textbook")
    def pipeline(project: str = "local", location: str = "us-central1"):
        train = CustomTrainingJobOp(
            project=project, location=location, display_name="textbook-train", base_output_directory=job_dir,
            worker_pool_specs=[{"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
                                "container_spec": {"image_uri": "python:3.11", "command": [
                                    "python3", "-c", COPY, trained_model, "/gcs/" + model_dir[len("gs://"):]]}}])
        unmanaged = dsl.importer(artifact_uri=model_dir, artifact_class=artifact_types.UnmanagedContainerModel,
                                 metadata={"containerSpec": {"imageUri": IMAGE}}).after(train)
        upload = ModelUploadOp(project=project, location=location, display_name="textbook-model",
                               unmanaged_container_model=unmanaged.outputs["artifact"])
        endpoint = EndpointCreateOp(project=project, location=location, display_name="textbook-endpoint")
        ModelDeployOp(endpoint=endpoint.outputs["endpoint"], model=upload.outputs["model"],
                      dedicated_resources_machine_type="n1-standard-2", dedicated_resources_min_replica_count=1,
                      dedicated_resources_max_replica_count=1)
        ModelBatchPredictOp(project=project, location=location, job_display_name="textbook-batch",
                            model=upload.outputs["model"], gcs_source_uris=[instances], instances_format="jsonl",
                            predictions_format="jsonl", gcs_destination_output_uri_prefix=predictions,
                            machine_type="n1-standard-2", starting_replica_count=1, max_replica_count=1)

    return pipeline
