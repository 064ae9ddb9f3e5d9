"""In a job's Python: google-cloud-aiplatform's defaults point at the platform that runs the job, as on
Vertex AI, where the SDK's default endpoint is the service the job runs in.

Copied into every job's virtual environment (``job_env.PythonEnv``) with a ``.pth`` line that imports
it, and installed by the job's own process (``job_child``: what a warm job's forked replica inherits); it does nothing until ``google.cloud.aiplatform.initializer`` is imported, and then only sets what
``aiplatform.init()`` leaves unset:

- the API endpoint and REST transport: ``MODELYARD_PLATFORM`` (the platform's URL; the SDK's own
  default, ``{region}-aiplatform.googleapis.com`` over gRPC, does not exist here);
- the project, from ``CLOUD_ML_PROJECT_ID`` when it is not a project number. The SDK would ask Cloud
  Resource Manager to turn that variable into a project id; there is none here (the call retries for a
  minute before the SDK falls back to the variable), and the platform's variable holds the id already.
  Credentials are left to the SDK: ``google.auth.default()``, i.e. the job's metadata server.

May import: the standard library only (it runs at every start of the job's Python).
"""
from __future__ import annotations

import importlib.abc
import os
import sys

TARGET = "google.cloud.aiplatform.initializer"


def apply(config) -> None:
    """Set the job's defaults on the SDK's ``global_config`` where nothing set them."""
    url = os.environ.get("MODELYARD_PLATFORM")
    if url and getattr(config, "_api_endpoint", None) is None:
        config._api_endpoint = url
        if getattr(config, "_api_transport", None) is None:
            config._api_transport = "rest"
    project = os.environ.get("CLOUD_ML_PROJECT_ID", "")
    if project and not project.isdigit() and getattr(config, "_project", None) is None:
        config._project = project


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            apply(module.global_config)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """In this process and every process forked from it: the defaults set when the SDK's initializer is
    imported (now, when it is already). The job's process calls it (``job_child``), so a replica forked
    from it (a warm job: the platform's Python, without the venv's ``.pth``) has it as a fresh one does."""
    if not os.environ.get("MODELYARD_PLATFORM"):
        return
    loaded = sys.modules.get(TARGET)
    if loaded is not None and hasattr(loaded, "global_config"):
        apply(loaded.global_config)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
