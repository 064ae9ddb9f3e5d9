"""Shared, session-scoped fixtures: each model is built and converted once per test session."""
from __future__ import annotations

import os
from pathlib import Path

import modelyard  # noqa: F401  (sets the TF/Keras environment before TensorFlow is imported)
import pytest

@pytest.fixture(scope="session")
def demo_base(tmp_path_factory) -> Path:
    """The demo digits classifier (versions 0001, 0002), built into a per-session cache
    unless MODELYARD_CACHE points at an existing one."""
    from modelyard.demo import ensure_demo_model

    cache = os.environ.get("MODELYARD_CACHE") or tmp_path_factory.mktemp("cache")
    return ensure_demo_model(cache_dir=Path(cache), log=lambda _m: None)


@pytest.fixture(scope="session")
def demo_prepared(demo_base):
    from modelyard.edge.pipeline import prepare

    return prepare(str(demo_base), representative="digits")


@pytest.fixture(scope="session")
def demo_reports(demo_prepared) -> dict:
    """One ``compare`` run (none, dynamic, float16, int8 with uint8 I/O) keyed by mode."""
    from modelyard.edge.pipeline import compare

    return {r.mode: r for r in compare(demo_prepared, io_dtype="uint8")}
