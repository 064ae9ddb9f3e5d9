"""What the task server (``warm_jobs``: the warm interpreter pipeline tasks are forked from) imports:
everything a pipeline task's job process (``job_child`` running a custom job) imports before its
replica starts, and what a KFP lightweight component's step imports (KFP's executor and ``kfp.dsl``,
which its program imports with ``from kfp.dsl import *``). A job process finds this module in
``sys.modules`` when it was forked from that server (``warm_jobs.in_warm_process``).

Imports only: no thread may be started here (the server forks; ``forkserver._preload`` checks).
"""
from __future__ import annotations

# The job's process: job_child, its custom job kind, the launcher, the job's identity (its gateway's
# certificates; its metadata server, forked from it: job_identity) and Python environment.
# (Not job_child itself: the fork runs it as __main__, which runpy warns of when it is imported already.)
import venv  # noqa: F401

import aiohttp  # noqa: F401
from aiohttp import web  # noqa: F401
from cryptography import x509  # noqa: F401
from cryptography.hazmat.primitives import hashes, serialization  # noqa: F401
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: F401

import modelyard.platform.api.errors  # noqa: F401
import modelyard.platform.jobs.custom_jobs  # noqa: F401
import modelyard.platform.jobs.job_identity  # noqa: F401
import modelyard.platform.jobs.job_runner  # noqa: F401
import modelyard.platform.jobs.metadata_server  # noqa: F401
import modelyard.platform.jobs.sdk_defaults  # noqa: F401
import modelyard.platform.storage  # noqa: F401  (a /gcs/ path of a served bucket: job_env.GcsMount)
import modelyard.training.launcher  # noqa: F401

# A KFP lightweight component's step (``kfp_task``): the executor's modules, not executor_main itself
# (runpy runs that as __main__).
try:
    import kfp.dsl  # noqa: F401
    import kfp.dsl.executor  # noqa: F401
    import kfp.dsl.kfp_config  # noqa: F401
    import kfp.dsl.utils  # noqa: F401
except ImportError:  # no kfp here: a component's step installs or imports it itself
    pass
