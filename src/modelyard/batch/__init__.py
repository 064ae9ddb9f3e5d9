"""Batch prediction jobs: many instances from files through a model, into sharded result files.

Vertex AI's batch prediction, on this machine: JSONL/CSV/TFRecord/file-list inputs, results in
``prediction-<model>-<timestamp>/prediction.results-0000K-of-0000N`` plus one error file, rows
the model refuses isolated into error lines, and exactly-once resume after a crash.

    job = modelyard.batch_predict("models/m", "data/*.jsonl", "out/")
    job.state, job.completion_stats, list(job.iter_outputs())

May import: ``modelyard.model`` (runtime, signatures, dtypes, export's version listing),
``modelyard.errors``, ``modelyard.objstore`` (gs:// and s3://). Never ``serving``: jobs run the model in-process, not through a server.
"""
from modelyard.batch.api import batch_predict
from modelyard.batch.job import BatchPredictionJob
from modelyard.batch.spec import BatchError

__all__ = ["batch_predict", "BatchPredictionJob", "BatchError"]
