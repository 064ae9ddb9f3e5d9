"""Vertex AI ``CustomJob``: worker pools run as local processes, one per replica.

A pool's ``containerSpec.command`` + ``args`` (the image URI is recorded and otherwise ignored) or
``pythonPackageSpec`` (its packages pip-installed with their dependencies into the job's own
virtual environment, then ``python -m module args``) is the command of each of its replicas. Pools
map to TF roles as on Vertex: pool 0 the chief (exactly one replica), 1 workers, 2 parameter
servers, 3 the evaluator; the replicas run under modelyard's launcher, which gives each its
``TF_CONFIG`` (when there is more than one) and stops the rest when one fails. Every replica gets
Vertex's ``AIP_MODEL_DIR``, ``AIP_CHECKPOINT_DIR`` and ``AIP_TENSORBOARD_LOG_DIR`` under
``baseOutputDirectory`` (gs:// URIs when it is one), ``CLUSTER_SPEC``, ``CLOUD_ML_PROJECT_ID``,
``CLOUD_ML_JOB_ID`` and its ``/gcs/`` paths (job_env). A bucket the job names that does not exist
is refused at create.

A job whose process was forked from the platform's warm interpreter (warm_jobs: one replica, a
TensorFlow Python command, or a pipeline task) forks that replica from itself too
(``warm_jobs.fork_replica``) instead of starting a fresh Python, unless it says why not (in the log).
"""
from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
from pathlib import Path

from modelyard import objstore
from modelyard.platform.jobs import job_env, job_packages, warm_jobs
from modelyard.platform.api.errors import invalid
from modelyard.platform.api.names import Route
from modelyard.platform.resources import metadata_experiments, tensorboards
from modelyard.platform.state.metadata_db import MetadataDB
from modelyard.platform.state.tensorboard_db import TensorboardDB

RESUMABLE = False  # a training command may not be safe to start twice; a lost one fails
ROLES = ("chief", "worker", "ps", "evaluator")  # worker pool index -> TF_CONFIG task type
REPLICA_POLL_S = 0.02  # how soon a replica's end is seen: what follows the job (a pipeline's next task) waits on it


async def validate(p, route: Route, body: dict) -> tuple[dict, dict]:
    job_spec = body.get("jobSpec")
    if not isinstance(job_spec, dict):
        raise invalid("CustomJob.job_spec is required.")
    check_job_spec(job_spec)
    await asyncio.to_thread(job_env.check_storage, job_spec)  # a missing bucket: refused now, nothing made
    await asyncio.to_thread(job_packages.check, job_spec)  # packages that cannot be installed: likewise
    # Its experiment and run checked; the run made when only the experiment is named, as Vertex does.
    job_spec.update(await asyncio.to_thread(metadata_experiments.job_experiment, MetadataDB(p.store.engine), job_spec))
    if job_spec.get("tensorboard"):  # where its AIP_TENSORBOARD_LOG_DIR is sent (tensorboard_upload)
        if job_spec.get("experiment"):
            raise invalid("job_spec.experiment and job_spec.tensorboard cannot be set together.")
        await asyncio.to_thread(tensorboards.check_tensorboard, TensorboardDB(p.store.engine),
                                job_spec["tensorboard"], "job_spec.tensorboard")
    return {k: v for k, v in body.items() if k not in ("displayName", "labels", "name", "state")}, {}


def check_job_spec(job_spec: dict) -> list[dict]:
    """The worker pools of a CustomJobSpec, each ``{"role", "replicas", "command", "env", "packages"}``;
    INVALID_ARGUMENT naming the field for anything modelyard cannot run."""
    pools = job_spec.get("workerPoolSpecs")
    if not isinstance(pools, list) or not pools or len(pools) > len(ROLES):
        raise invalid("job_spec.worker_pool_specs must list 1 to 4 worker pools (primary, workers, "
                      "parameter servers, evaluator).")
    out = []
    for i, pool in enumerate(pools):
        where = f"job_spec.worker_pool_specs[{i}]"
        if not isinstance(pool, dict):
            raise invalid(f"{where} must be an object.")
        if not pool:  # an empty pool keeps a slot, as on Vertex ([primary, {}, ps])
            if i == 0:
                raise invalid(f"{where}: the primary pool is required.")
            continue
        replicas = _count(pool.get("replicaCount", 1), f"{where}.replica_count")
        if i == 0 and replicas != 1:
            raise invalid(f"{where}.replica_count is {replicas}: the primary pool has exactly one replica.")
        if i == 3 and replicas > 1:
            raise invalid(f"{where}.replica_count is {replicas}: there is at most one evaluator.")
        container, package = pool.get("containerSpec"), pool.get("pythonPackageSpec")
        if bool(container) == bool(package):
            raise invalid(f"{where}: give exactly one of container_spec and python_package_spec.")
        spec = container or package
        if not isinstance(spec, dict):
            raise invalid(f"{where}: container_spec / python_package_spec must be an object.")
        args = _strings(spec.get("args", []), f"{where}.args")
        env = spec.get("env", [])
        if not isinstance(env, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str) and e["name"]
                                                and isinstance(e.get("value", ""), str) for e in env):
            raise invalid(f"{where}.env must be a list of {{name, value}} strings.")
        if container:
            command = _strings(container.get("command", []), f"{where}.container_spec.command")
            if not command:
                raise invalid(f"{where}.container_spec.command is required: modelyard runs the pool's command "
                              "as a local process and cannot run an image's entrypoint "
                              f"(image_uri {container.get('imageUri')!r} is recorded only).")
            if shutil.which(command[0]) is None:
                raise invalid(f"{where}.container_spec.command[0] {command[0]!r} is not an executable on the "
                              "platform's PATH.")
            packages: list[str] = []
        else:
            module, packages = job_packages.parse(package, f"{where}.python_package_spec")
            command = [sys.executable, "-m", module]  # the job's own Python replaces it (run_pools)
        gpus = _count((pool.get("machineSpec") or {}).get("acceleratorCount", 0),
                      f"{where}.machine_spec.accelerator_count")
        if replicas:
            out.append({"role": ROLES[i], "replicas": replicas, "command": command + args, "gpus": gpus,
                        "env": {e["name"]: e.get("value", "") for e in env}, "packages": packages})
    base = (job_spec.get("baseOutputDirectory") or {}).get("outputUriPrefix")
    if base is not None and (not isinstance(base, str) or not base):
        raise invalid("job_spec.base_output_directory.output_uri_prefix must be a URI.")
    if base:
        objstore.scheme_of(base)
    return out


def _count(value, field: str) -> int:
    try:
        n = int(value)  # int64 arrives as a string in proto3 JSON
    except (TypeError, ValueError):
        raise invalid(f"{field} must be an integer, got {value!r}.") from None
    if n < 0 or isinstance(value, bool):
        raise invalid(f"{field} must be 0 or more, got {value!r}.")
    return n


def _strings(value, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(f"{field} must be a list of strings.")
    return list(value)


def warm_blocker(spec: dict, engine: dict | None, work_dir: Path) -> str | None:
    """For the runner: why this job (its stored spec) cannot start from the platform's warm
    interpreter (None: it can)."""
    return warm_jobs.blocker(check_job_spec(spec["jobSpec"]), engine, work_dir)


# ---- the child side -----------------------------------------------------------------------------
def processes_elsewhere(job: dict) -> bool:
    """For the job's process: its replicas run on Ray nodes (``--engine ray``), each with the job's
    identity served on its node (jobs_ray), so the job's process serves none itself."""
    return (job.get("engine") or {}).get("name") == "ray"


def execute(work_dir: Path, job: dict) -> dict:
    run_pools(job["spec"]["jobSpec"], work_dir, job["id"], engine=job.get("engine"),
              project=job["parent"].split("/")[1], storage_root=job.get("storageRoot"))
    return {}


def _send_tensorboard_logs(tensorboard: str, logdir: str, job_id: str) -> None:
    """The job's TensorBoard logs into ``jobSpec.tensorboard`` (experiment = the job's id), as Vertex does;
    a failure is said in the job's log and does not fail the job."""
    import os

    from modelyard.platform.jobs import tensorboard_upload
    from modelyard.tuning.experiment import job_token

    try:
        n = tensorboard_upload.upload(logdir, tensorboard, job_id, os.environ.get("MODELYARD_PLATFORM", ""),
                                      job_token())
        print(f"sent {n} TensorBoard scalar point(s) from {logdir} to {tensorboard}/experiments/{job_id}", flush=True)
    except Exception as exc:  # the training itself succeeded or failed on its own
        print(f"could not send the TensorBoard logs {logdir} to {tensorboard}: {exc}", flush=True)


def output_env(base: str) -> dict[str, str]:
    """Vertex AI's output directories under a job's base output directory."""
    base = base.rstrip("/")
    return {"AIP_MODEL_DIR": f"{base}/model/", "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
            "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/"}


def run_pools(job_spec: dict, work_dir: Path, job_id: str, extra_args: list[str] = (),
              engine: dict | None = None, project: str = "local", storage_root: str | None = None,
              node_files: dict[str, bytes] | None = None) -> None:
    """Run the job's pools to the end; JobFailed (with the failed replica's last lines) if one fails,
    JobFailed(CANCELLED) on SIGTERM after stopping every replica. ``engine`` ``{"name": "ray",
    "address": ...}`` (the platform's ``--engine ray``) runs each replica on a Ray node (jobs_ray);
    otherwise they are processes of this host. The replicas' Python, variables and /gcs/ paths are
    job_env's (``storage_root``: the Cloud Storage the platform serves, whose files /gcs/ paths are).
    ``node_files`` (relative path -> bytes: a tuning trial's shipped files) go to each Ray node's
    working directory; a local replica finds them in its own (the caller's)."""
    from modelyard.platform.jobs.job_runner import JobFailed
    from modelyard.training import cluster as cluster_mod
    from modelyard.training import launcher

    pools = check_job_spec(job_spec)
    base = (job_spec.get("baseOutputDirectory") or {}).get("outputUriPrefix")
    scheme = objstore.scheme_of(base) if base else ""
    # gs://: the replicas get gs:// URIs and write them themselves (the platform's storage), as on
    # Vertex; s3:// (not Vertex's): written locally and published at the end; else a local directory.
    remote = scheme == "s3"
    local_base = str(work_dir / "output") if remote or not base else objstore.local_path(base)
    dirs = output_env(base) if scheme == "gs" else output_env(local_base)
    if scheme != "gs":
        for d in dirs.values():
            Path(d).mkdir(parents=True, exist_ok=True)
    env = job_env.vertex_env(project, job_id, dirs)
    env.update(job_env.experiment_env(job_spec))
    mount = job_env.GcsMount(work_dir, storage_root)
    on_ray = (engine or {}).get("name") == "ray"
    node_setup = None
    if on_ray:  # each node makes the job's Python, /gcs/ mirror and output for itself (jobs_ray.NodeSetup)
        from modelyard.platform.jobs import jobs_ray

        node_setup = jobs_ray.NodeSetup.of([u for pool in pools for u in pool["packages"]],
                                           None if scheme == "gs" else local_base, node_files)
        for pool in pools:
            if pool["packages"]:
                pool["command"][0] = jobs_ray.PACKAGE_PYTHON
    else:
        mount.stage_in(job_env.pool_strings(job_spec))
        python = job_packages.install(work_dir, [u for pool in pools for u in pool["packages"]], mount)
        env.update(python.env())
        for pool in pools:
            pool["command"] = [mount.rewrite(a) for a in pool["command"]]
            if pool["packages"]:  # python -m module: the job's own interpreter, where its packages are
                pool["command"][0] = python.python
            pool["env"] = {k: mount.rewrite(v) for k, v in pool["env"].items()}

    by_role = {pool["role"]: pool for pool in pools}
    count = {role: by_role[role]["replicas"] if role in by_role else 0 for role in ROLES}
    placement = None
    if on_ray:
        placement = jobs_ray.Placement(engine.get("address", ""), job_id)
        placement.connect()  # before our SIGTERM handler: ray.init installs its own
    launcher._STOP_REQUESTED.clear()
    signal.signal(signal.SIGTERM, lambda *_: launcher._STOP_REQUESTED.set())  # cancel: stop every replica
    try:
        if placement is None:
            spec = cluster_mod.local_spec(count["worker"], count["ps"], chief=True)
        else:  # the nodes' addresses, with ports reserved on the nodes
            spec = placement.place(count, count["evaluator"] > 0, {p["role"]: p["gpus"] for p in pools})
    except BaseException as exc:
        if placement is not None:
            placement.close()
        if isinstance(exc, KeyboardInterrupt):  # cancelled while the replicas waited for nodes
            raise JobFailed("CANCELED", "CANCELLED") from None
        raise
    tasks = cluster_mod.tasks_of(spec, evaluator=count["evaluator"] > 0)
    vertex_cluster = {f"workerpool{ROLES.index(role)}": addrs for role, addrs in spec.items()}
    several = len(tasks) > 1

    class Pools(jobs_ray.RaySupervisor if placement is not None else launcher.Supervisor):
        """The launcher's supervision, with each pool's own command and Vertex's environment."""

        def _env(self, task):
            out = super()._env(task)
            if not several:
                out.pop("TF_CONFIG", None)  # as on Vertex: a single replica gets no cluster
            out.update(env)
            out.update(by_role[task.type]["env"])
            out["CLUSTER_SPEC"] = json.dumps({"cluster": vertex_cluster, "environment": "cloud", "task": {
                "type": f"workerpool{ROLES.index(task.type)}", "index": task.index}})
            return out

        def _start_task(self, task):
            self.command = by_role[task.type]["command"] + list(extra_args)
            return super()._start_task(task)

        def _popen(self, task):
            if warm:
                child, why = warm_jobs.fork_replica(self.command, self._env(task), Path.cwd(),
                                                    work_dir / warm_jobs.PIDS_FILE)
                if child is not None:
                    return child
                self._emit(task, f"[modelyard] cold start (not forked from the warm interpreter): {why}")
            return super()._popen(task)

    # Forked from the warm interpreter: its one replica is forked from here (see warm_jobs).
    warm = placement is None and len(tasks) == 1 and warm_jobs.in_warm_process()
    sup = Pools(spec, tasks, by_role["chief"]["command"], out=sys.stdout)
    sup.placement = placement
    sup.node_setup = node_setup
    cancelled = False
    try:
        sup.start()
        ok, why = sup.wait(poll=REPLICA_POLL_S)
    except KeyboardInterrupt:  # the launcher's loop turns the stop request into this
        ok, why, cancelled = False, "cancelled", True
    finally:
        if sys.exc_info()[0] is not None or cancelled:
            sup.stop()
        if placement is not None:
            placement.close()
        if remote:
            n = objstore.publish_tree(Path(local_base), base)
            print(f"published {n} output file(s) to {base}", flush=True)
        n = mount.publish()
        if n:
            print(f"wrote {n} file(s) under /gcs/ back to their buckets", flush=True)
        if job_spec.get("tensorboard"):
            _send_tensorboard_logs(job_spec["tensorboard"], dirs["AIP_TENSORBOARD_LOG_DIR"], job_id)
    if cancelled:
        raise JobFailed("CANCELED", "CANCELLED")
    if not ok:
        raise JobFailed(why, "INTERNAL")

