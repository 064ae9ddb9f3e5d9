"""A KFP v2 pipeline with dsl.If / dsl.Else on a computed value (test_pipeline_jobs.py compiles it):
flip says "heads" for a positive number; only the branch whose condition holds runs. No
``from __future__ import annotations``: kfp reads the components' annotations as types."""
from kfp import dsl


@dsl.component(base_image="python:3.11")
def flip(n: int) -> str:
    return "heads" if n > 0 else "tails"


@dsl.component(base_image="python:3.11")
def say(msg: str) -> str:
    return msg


@dsl.pipeline(name="branches")
def branches(n: int = 1):
    coin = flip(n=n)
    with dsl.If(coin.output == "heads"):
        say(msg="heads won").set_display_name("heads")
    with dsl.Else():
        say(msg="tails won").set_display_name("tails")
