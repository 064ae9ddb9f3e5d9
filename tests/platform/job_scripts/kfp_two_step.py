"""A two-step KFP v2 pipeline of lightweight Python components (test_pipeline_jobs.py compiles it):
make_data writes a Dataset, count reads it. No ``from __future__ import annotations``: kfp reads the
components' annotations as types."""
from kfp import dsl


@dsl.component(base_image="python:3.11")
def make_data(rows: int, data: dsl.Output[dsl.Dataset]):
    import sys

    with open(data.path, "w") as f:
        f.write("\n".join(f"row{i}" for i in range(rows)))
    data.metadata["rows"] = rows
    data.metadata["python"] = [sys.executable, sys.prefix]  # the job's own Python, warm or cold


@dsl.component(base_image="python:3.11")
def count(data: dsl.Input[dsl.Dataset], fail: bool) -> int:
    if fail:
        raise RuntimeError("count was told to fail")
    with open(data.path) as f:
        return len(f.read().splitlines())


@dsl.pipeline(name="two-step")
def two_step(rows: int = 3, fail: bool = False):
    made = make_data(rows=rows)
    count(data=made.outputs["data"], fail=fail)
