"""A one-step KFP v2 pipeline that logs a metric (test_pipeline_jobs.py submits it to an experiment). No
``from __future__ import annotations``: kfp reads the components' annotations as types."""
from kfp import dsl


@dsl.component(base_image="python:3.11")
def score(rows: int, metrics: dsl.Output[dsl.Metrics]):
    metrics.log_metric("accuracy", rows / 8)


@dsl.pipeline(name="scored")
def scored(rows: int = 6, note: str = "first"):
    score(rows=rows)
