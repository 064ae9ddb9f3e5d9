"""A job's identity, as Vertex AI gives a training container: a metadata server, credentials of its own,
and TensorFlow's ``gs://`` reaching the platform's storage.

- **Metadata server** (``metadata_server``, one process started by the job's process and gone with it;
  for a job on Ray nodes, one per replica, started on its node by its actor: ``serve``, the same rule):
  ``GCE_METADATA_HOST``/``GCE_METADATA_IP`` of every process of the job, so ``google.auth.default()``
  returns credentials and the job's project, and ``storage.Client()``, ``aiplatform.init()`` with no
  arguments (the job's Python points the SDK at the platform: ``sdk_defaults``) and TensorFlow find them.
- **Its own token.** Behind ``--auth-token`` the credentials are a token minted for the job when the
  runner starts it and ended when the job ends (``api.job_tokens``): the storage takes it, the control
  API takes it for the job's own project. The platform's token is in no job's environment (nor in the
  warm interpreter's, whose environment forked jobs show).
- **TensorFlow's gs://.** The same process is the job's storage gateway (``modelyard.tf_gcs``): the
  ``STORAGE_EMULATOR_HOST`` of the job's processes (a request without credentials gets the job's), and
  the ``HTTPS_PROXY`` + ``CURL_CA_BUNDLE`` that send TensorFlow's own ``gs://`` (``model.save``,
  checkpoints, summaries, ``tf.data``) to the platform's storage. ``AIP_*`` directories stay ``gs://``.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator, Mapping, MutableMapping

from modelyard import tf_gcs
from modelyard.platform.api import job_tokens

# ---- a job's identity (platform side: the job runner) -------------------------------------------
# The platform's own token, under every name it travels by: never in a job's environment.
ADMIN_TOKEN_VARS = ("MODELYARD_STORAGE_TOKEN", "MODELYARD_PLATFORM_TOKEN")
# Credentials a job must not pick up from the platform's user instead of its metadata server.
_FOREIGN_CREDENTIALS = ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "NO_GCE_CHECK")


def issue_token(admin_token: str | None, job: str) -> str | None:
    """A live token of its own for ``job`` (``projects/p/locations/l/KIND/id``); None without ``--auth-token``."""
    if not admin_token or job_tokens.directory() is None:  # no directory: a platform not started by its CLI
        return None
    token = job_tokens.mint(admin_token, job, job.split("/")[1])
    job_tokens.activate(token, job)
    return token


def end_tokens(job: str) -> int:
    """The job has ended: its tokens stop working."""
    return job_tokens.revoke(job)


def without_admin_token(environ: Mapping[str, str], job_token: str | None = None) -> dict[str, str]:
    """``environ`` for a job's process: the platform's token removed; the job's own, when it has one, as
    the storage token its processes send (``modelyard.objstore``)."""
    env = {k: v for k, v in environ.items() if k not in ADMIN_TOKEN_VARS}
    if job_token:
        env["MODELYARD_STORAGE_TOKEN"] = job_token
    return env


# ---- run time (the job's process, or its replica's Ray node) --------------------------------------
@contextlib.contextmanager
def serve(work_dir: Path, storage: str, token: str | None, project: str,
          environ: Mapping[str, str] | None = None, fork: bool = False) -> Iterator[dict[str, str]]:
    """While the block runs: a job's metadata server and storage gateway (one process,
    ``metadata_server``, under ``work_dir/identity``) forwarding to ``storage`` with ``token``. Yields
    the variables that point the job's processes at it (``identity_env``; hand them to ``apply``).
    The one rule for a job whose processes run on the platform's host (``job_identity``) and for each
    replica on a Ray node (``jobs_ray``: the node's own server, for the processes it starts).
    ``environ``: the job processes' environment (default: this process's), which the server inherits.
    ``fork``: the server is forked from this process (a pipeline task's warm job process, which has its
    modules imported: ``warm_jobs.may_fork_here``) rather than a fresh Python."""
    where = work_dir / "identity"
    shutil.rmtree(where, ignore_errors=True)
    proc, settings = tf_gcs.start_process(storage, token, where, ["--project", project],
                                          module="modelyard.platform.jobs.metadata_server",
                                          env=None if environ is None else dict(environ), fork=fork)
    try:
        yield identity_env(settings, work_dir, environ)
    finally:
        # Killed, not asked to stop: the job's processes are done with it, and its graceful stop (closing
        # its listeners and sessions, then Python's own exit) is time the job's end would wait for.
        proc.kill()
        proc.wait()


def apply(environ: MutableMapping[str, str], identity: Mapping[str, str]) -> None:
    """``environ`` (a job process's environment) pointing at its metadata server and gateway: credentials
    of the platform's user that would win over the metadata server removed, ``identity`` set."""
    for name in _FOREIGN_CREDENTIALS:
        environ.pop(name, None)
    environ.update(identity)


@contextlib.contextmanager
def job_identity(work_dir: Path, job: dict, on_nodes: bool = False, fork: bool = False) -> Iterator[dict[str, str]]:
    """While a job's process runs its kind: its metadata server and storage gateway (``serve``), and this
    process's environment (inherited by everything the job starts) pointing at them. Yields the
    variables set. ``on_nodes``: the job's processes run on Ray nodes (a custom job's replicas or a tuning
    job's trials under ``--engine ray``, its kind's ``processes_elsewhere``), each node serving its own
    (``jobs_ray``, with the same ``serve``): none here. Batch jobs and the rest run here under either engine."""
    storage = os.environ.get("STORAGE_EMULATOR_HOST")
    if not storage or on_nodes:
        yield {}
        return
    with serve(work_dir, storage, job.get("token"), job["parent"].split("/")[1], fork=fork) as env:
        apply(os.environ, env)
        yield env


def identity_env(settings: dict, work_dir: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of a job's processes for its metadata server and storage gateway (``settings``);
    ``environ``: the rest of their environment (default: this process's)."""
    host = settings["storage"].split("://", 1)[1]
    env = {"GCE_METADATA_HOST": host, "GCE_METADATA_ROOT": host, "GCE_METADATA_IP": host,
           "STORAGE_EMULATOR_HOST": settings["storage"],
           # No gcloud configuration or application-default credentials of the platform's user.
           "CLOUDSDK_CONFIG": str(work_dir / "gcloud")}
    env.update(tf_gcs.tensorflow_env(settings, None, {**(os.environ if environ is None else environ), **env}))
    return env
