"""Shared, session-scoped fixtures: each model is built and converted once per test session."""
from __future__ import annotations

from pathlib import Path

import modelyard  # noqa: F401  (sets the TF/Keras environment before TensorFlow is imported)
import pytest

@pytest.fixture(scope="session")
def demo_base(demo_cache) -> Path:
    """The demo digits classifier (versions 0001, 0002), from the run's one demo cache (tests/conftest.py)."""
    from modelyard.demo import ensure_demo_model

    return ensure_demo_model(cache_dir=demo_cache, log=lambda _m: None)


@pytest.fixture(scope="session")
def demo_prepared(demo_base):
    from modelyard.edge.pipeline import prepare

    return prepare(str(demo_base), representative="digits")


@pytest.fixture(scope="session")
def demo_reports(demo_prepared) -> dict:
    """One ``compare`` run (none, dynamic, float16, int8 with uint8 I/O) keyed by mode."""
    from modelyard.edge.pipeline import compare

    return {r.mode: r for r in compare(demo_prepared, io_dtype="uint8")}
