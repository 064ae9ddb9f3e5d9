"""A KFP v2 pipeline the platform is killed in the middle of (test_pipeline_jobs.py compiles it): stamp
appends a line to a file each time it runs; two steps after it wait for a file the test writes once the
platform is back (the second may retry once). No ``from __future__ import annotations``: kfp reads the
components' annotations as types."""
from kfp import dsl


@dsl.component(base_image="python:3.11")
def stamp(path: str) -> str:
    with open(path, "a") as f:
        f.write("ran\n")
    return "stamped"


@dsl.component(base_image="python:3.11")
def wait_for(path: str, tag: str) -> str:
    import os
    import time

    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.05)
    return tag


@dsl.pipeline(name="resume")
def resume(stamp_path: str, done_path: str):
    first = stamp(path=stamp_path)
    wait_for(path=done_path, tag=first.output).set_display_name("adopted")
    wait_for(path=done_path, tag="again").set_retry(num_retries=1).after(first)
