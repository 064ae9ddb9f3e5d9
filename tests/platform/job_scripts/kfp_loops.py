"""KFP v2 pipelines with dsl.ParallelFor (test_pipeline_jobs.py compiles them). No ``from __future__
import annotations``: kfp reads the components' annotations as types.

``fan``: six items, two at a time, each squared and written as a Dataset; one step adds the squares
(``dsl.Collected`` of a parameter) and one counts the datasets (of an artifact). ``nested``: a loop over
a task's output (a list of dicts, read by field) holding a loop over a constant list; a step that
fails once and is retried; an importer of an object the first step wrote."""
from kfp import dsl


@dsl.component(base_image="python:3.11")
def square(x: int, out: dsl.Output[dsl.Dataset]) -> int:
    with open(out.path, "w") as f:
        f.write(str(x * x))
    return x * x


@dsl.component(base_image="python:3.11")
def total(xs: list) -> int:
    return sum(xs)


@dsl.component(base_image="python:3.11")
def count_files(files: dsl.Input[list[dsl.Dataset]]) -> str:
    return ",".join(open(f.path).read() for f in files)


@dsl.pipeline(name="fan")
def fan():
    with dsl.ParallelFor([1, 2, 3, 4, 5, 6], parallelism=2) as x:
        sq = square(x=x)
    total(xs=dsl.Collected(sq.outputs["Output"]))
    count_files(files=dsl.Collected(sq.outputs["out"]))


@dsl.component(base_image="python:3.11")
def shapes(model: dsl.Output[dsl.Model]) -> list:
    with open(model.path, "w") as f:
        f.write("weights")
    return [{"tag": "a", "n": 1}, {"tag": "b", "n": 2}]


@dsl.component(base_image="python:3.11")
def label(name: str, k: int) -> str:
    return f"{name}{k}"


@dsl.component(base_image="python:3.11")
def flaky(marker: str) -> str:
    import os
    if not os.path.exists(marker):  # the first attempt fails and leaves the marker: the retry succeeds
        open(marker, "w").close()
        raise RuntimeError("flaky fails its first attempt")
    return "second time lucky"


@dsl.component(base_image="python:3.11")
def read_model(model: dsl.Input[dsl.Model]) -> str:
    with open(model.path) as f:
        return f"{model.metadata.get('source')}:{f.read()}"


@dsl.pipeline(name="nested")
def nested(marker: str, model_uri: str):
    made = shapes()
    with dsl.ParallelFor(made.outputs["Output"]) as shape:
        label(name=shape.tag, k=shape.n)  # (not .name: a channel's own attribute)
        with dsl.ParallelFor([10, 20]) as k:  # (kfp 2.17 compiles an outer item's field in here as a constant)
            label(name="k", k=k)
    flaky(marker=marker).set_retry(num_retries=2, backoff_duration="0s")
    imported = dsl.importer(artifact_uri=model_uri, artifact_class=dsl.Model, reimport=False,
                            metadata={"source": "importer"}).after(made)
    read_model(model=imported.output)
