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
from tests.parallel import (TIMES, assign_groups, build_once, make_scheduler, release_finished_group,
                            worker_port_slice)
from tests.tfserving_models import (
    MONITORING_CONFIG,
    configured_shared_path,
    shared_testdata,
    write_tfserving_models,
)

SHARED = shared_testdata()
SOURCES = ["generated"] + (["tfserving"] if SHARED else [])
worker_port_slice()  # under pytest-xdist: this worker and what it starts pick ports no other worker picks


@pytest.fixture(scope="session")
def generated_tfserving(tmp_path_factory) -> Path:
    """The generated stand-ins for TF Serving's test models, written once per session."""
    import modelyard  # noqa: F401  (sets the TF environment before TensorFlow is imported)

    # Once per run, for every xdist worker (tests/parallel.py).
    return build_once(tmp_path_factory, "tfserving_generated", lambda d: str(write_tfserving_models(d)))[0]


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

    if os.environ.get("MODELYARD_CACHE"):
        cache = Path(os.environ["MODELYARD_CACHE"])
        ensure_demo_model(cache_dir=cache, log=lambda _m: None)
        return cache
    # Trained once per run, for every xdist worker (tests/parallel.py).
    return build_once(tmp_path_factory, "demo_cache", lambda d: str(ensure_demo_model(cache_dir=d, log=lambda _m: None)))[0]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict:
    """The platform's tiny test models, built once per session for the platform and console tests."""
    from tests.platform.conftest import build_tiny_models

    return build_once(tmp_path_factory, "models", build_tiny_models)[1]  # once per run, for every xdist worker


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


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(session, config, items) -> None:
    config._tfserving_models_used = any("tfserving_testdata" in item.fixturenames for item in items)
    if hasattr(config, "workeroutput"):  # an xdist worker: the controller prints the summary line
        config.workeroutput["tfserving_models_used"] = config._tfserving_models_used
    classify(items)  # tests that start a process are e2e; ./scripts/test --quick runs the others
    assign_groups(items)  # for -n 2 --dist loadgroup: each expensive session fixture starts in one worker only


@pytest.hookimpl(optionalhook=True)  # an xdist hook: plain pytest runs without it
def pytest_xdist_make_scheduler(config, log):
    return make_scheduler(config, log)  # loadgroup, the group expected to take longest first


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """The xdist controller learns from its workers whether TF Serving's test models were used."""
    if getattr(node, "workeroutput", {}).get("tfserving_models_used"):
        node.config._tfserving_models_used = True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item) -> None:
    if "ray_cluster" in item.fixturenames:  # its fixtures are set up: the cluster runs
        ray_before_test(session_cluster())  # two nodes (a failed test may have killed one), idle


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    release_finished_group(item, nextitem)  # the last test of its xdist group: stop the group's servers
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with quick_guard(item):  # a test classified quick that starts a process fails, saying how to mark it
        return (yield)


GUARD.install()


def pytest_runtest_logreport(report) -> None:
    TIMES.add(report)  # in the xdist controller: which worker ran it, for the balance line below


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    for line in TIMES.lines():
        terminalreporter.write_line(f"xdist worker {line}")
    if config.option.collectonly or not getattr(config, "_tfserving_models_used", False):
        return
    if SHARED:
        line = f"conformance on TF Serving's own test models: run ({SHARED}), beside the generated stand-ins"
    else:
        line = f"conformance on TF Serving's own test models: not run ({configured_shared_path()} not found)"
    terminalreporter.write_sep("-", line)

# The shared local two-node Ray cluster (a session fixture): see tests/ray_cluster.py.
from tests.ray_cluster import before_test as ray_before_test, ray_cluster, session_cluster  # noqa: E402,F401
