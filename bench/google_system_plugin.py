"""pytest plugin of bench/google_system.py: points Google's own system tests (tests/system/aiplatform of
google-cloud-aiplatform, run unedited) at a local ``modelyard platform``, and does nothing else.

What a Google CI machine has and this one has not, given the way each library is made to take it:

- the API host: ``aiplatform.init(api_endpoint=..., api_transport="rest")`` (the SDK reads no variable for it).
  e2e_base's ``setup_method`` reloads ``initializer`` and ``aiplatform`` before every test, which forgets
  ``init()``'s settings, so it is said again just before each test body runs (the body's own ``init(project=,
  location=, experiment=...)`` then adds to it, as on Google's machines);
- credentials: ``google.auth.default()`` answers anonymous credentials and the project (no Google account here);
- Cloud Resource Manager (e2e_base's staging bucket asks it the project number): its client built with the
  platform as its host, over REST;
- Cloud Storage: ``STORAGE_EMULATOR_HOST`` (set by the bench, read by google-cloud-storage itself);
- the project: ``BUILD_SPECIFIC_GCLOUD_PROJECT`` (set by the bench, read by e2e_base).

Read from the environment: ``MODELYARD_GOOGLE_SYSTEM_API`` (the platform's URL) and
``BUILD_SPECIFIC_GCLOUD_PROJECT``. Loaded with ``pytest -p google_system_plugin`` (bench/ on PYTHONPATH).
"""
from __future__ import annotations

import os

import pytest

API = os.environ["MODELYARD_GOOGLE_SYSTEM_API"]
PROJECT = os.environ["BUILD_SPECIFIC_GCLOUD_PROJECT"]


def _anonymous_default(*_args, **_kwargs):
    import google.auth.credentials

    return google.auth.credentials.AnonymousCredentials(), PROJECT


def _point_resource_manager() -> None:
    """Every ProjectsClient made without client options (e2e_base's, the SDK's resource_manager_utils') talks
    to the platform over REST."""
    from google.cloud import resourcemanager, resourcemanager_v3

    base = resourcemanager_v3.ProjectsClient

    class PointedProjectsClient(base):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("client_options", {"api_endpoint": API})
            kwargs.setdefault("transport", "rest")
            super().__init__(*args, **kwargs)

    resourcemanager.ProjectsClient = resourcemanager_v3.ProjectsClient = PointedProjectsClient
    from google.cloud.aiplatform.utils import resource_manager_utils

    resource_manager_utils.resourcemanager.ProjectsClient = PointedProjectsClient


def _point_sdk() -> None:
    from google.cloud import aiplatform

    aiplatform.init(api_endpoint=API, api_transport="rest")


def pytest_configure(config) -> None:
    import google.auth

    google.auth.default = _anonymous_default
    _point_resource_manager()
    _point_sdk()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item) -> None:
    # After the test's setup (e2e_base.setup_method reloaded the SDK's initializer), before its body.
    _point_sdk()
