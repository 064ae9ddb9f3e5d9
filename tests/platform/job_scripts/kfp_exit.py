"""A KFP v2 pipeline whose step fails inside a dsl.ExitHandler (test_pipeline_jobs.py compiles it): the
exit task runs anyway and is told how the group ended. No ``from __future__ import annotations``: kfp
reads the components' annotations as types."""
from kfp import dsl


@dsl.component(base_image="python:3.11")
def boom():
    raise RuntimeError("boom went the step")


@dsl.component(base_image="python:3.11")
def cleanup(status: dsl.PipelineTaskFinalStatus) -> str:
    return f"{status.state} {status.pipeline_task_name} {status.error_code}"


@dsl.pipeline(name="exits")
def exits():
    with dsl.ExitHandler(cleanup()):
        boom()
