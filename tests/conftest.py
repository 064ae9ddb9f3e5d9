"""Session-wide fixtures: TF Serving's half_plus_two test models, from two sources.

Every test that needs them asks for ``tfserving_testdata``: a folder in TF Serving's testdata
layout. It is always the stand-ins ``tests/tfserving_models.py`` generates (so a plain clone
runs green), and in addition TF Serving's own files where ``../shared/testdata/tfserving``
exists (the conformance run; CI always has it). The terminal summary says which ran.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.classify import GUARD, classify, quick_guard
from tests.tfserving_models import (
    MONITORING_CONFIG,
    configured_shared_path,
    shared_testdata,
    write_tfserving_models,
)

SHARED = shared_testdata()
SOURCES = ["generated"] + (["tfserving"] if SHARED else [])


@pytest.fixture(scope="session")
def generated_tfserving(tmp_path_factory) -> Path:
    """The generated stand-ins for TF Serving's test models, written once per session."""
    import modelyard  # noqa: F401  (sets the TF environment before TensorFlow is imported)

    return write_tfserving_models(tmp_path_factory.mktemp("tfserving_generated"))


@pytest.fixture(scope="session", params=SOURCES)
def tfserving_testdata(request) -> Path:
    """A folder in TF Serving's testdata layout: ``generated``, then ``tfserving`` (its own files) if present."""
    if request.param == "generated":
        return request.getfixturevalue("generated_tfserving")
    return SHARED


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    """A MODELYARD_CACHE holding the demo digits model (0001, 0002), trained once per test run for
    every folder that needs it (edge, web, serving), or the cache MODELYARD_CACHE names."""
    import os

    from modelyard.demo import ensure_demo_model

    cache = Path(os.environ.get("MODELYARD_CACHE") or tmp_path_factory.mktemp("demo_cache"))
    ensure_demo_model(cache_dir=cache, log=lambda _m: None)
    return cache


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict:
    """The platform's tiny test models, built once per session for the platform and console tests."""
    from tests.platform.conftest import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """modelyard's own Cloud Storage (``python -m modelyard.platform.storage``, what ``modelyard platform``
    serves) on a free port, with the SDK's staging bucket created (for the platform's and the batch
    package's gs:// tests); ``root`` is the directory its objects are files in."""
    from tests.platform.conftest import STAGING_BUCKET
    from tests.storage_server import storage_session

    yield from storage_session(tmp_path_factory, STAGING_BUCKET)


@pytest.fixture(scope="session")
def monitoring_config(tmp_path_factory) -> Path:
    """A MonitoringConfig enabling Prometheus at TF Serving's path, for servers of any test."""
    path = tmp_path_factory.mktemp("monitoring") / "monitoring_config.txt"
    path.write_text(MONITORING_CONFIG)
    return path


def pytest_collection_modifyitems(session, config, items) -> None:
    config._tfserving_models_used = any("tfserving_testdata" in item.fixturenames for item in items)
    classify(items)  # tests that start a process are e2e; ./scripts/test --quick runs the others


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with quick_guard(item):  # a test classified quick that starts a process fails, saying how to mark it
        return (yield)


GUARD.install()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if config.option.collectonly or not getattr(config, "_tfserving_models_used", False):
        return
    if SHARED:
        line = f"conformance on TF Serving's own test models: run ({SHARED}), beside the generated stand-ins"
    else:
        line = f"conformance on TF Serving's own test models: not run ({configured_shared_path()} not found)"
    terminalreporter.write_sep("-", line)

# The shared local two-node Ray cluster (a session fixture): see tests/ray_cluster.py.
from tests.ray_cluster import ray_cluster  # noqa: E402,F401
