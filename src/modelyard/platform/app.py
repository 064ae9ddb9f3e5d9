"""The platform process: store, operations, routing, replicas, gateway and supervisor, wired together."""
from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path

from modelyard.platform.dataplane.autoscale import Autoscaler, Policy
from modelyard.platform.dataplane.deadlines import DeadlinePolicy
from modelyard.platform.api.errors import ApiError, check_bearer
from modelyard.platform.api.fields import DEFAULT_MAX_PREDICT_BYTES, DEFAULT_MAX_REQUEST_BYTES
from modelyard.platform.dataplane.gateway import Gateway
from modelyard.platform.jobs.job_limits import JobLimits
from modelyard.platform.jobs.job_runner import JobRunner
from modelyard.platform.dataplane.metrics import Metrics
from modelyard.platform.dataplane import priority
from modelyard.platform.dataplane.pools import Pools, RayPools
from modelyard.platform.resources.operations import Operations
from modelyard.platform.dataplane.replicas import LocalEngine
from modelyard.platform.dataplane.replicas_ray import RayEngine
from modelyard.platform.dataplane.routing import Routing
from modelyard.platform.state.store import Store
from modelyard.platform.dataplane.supervisor import Readiness, Supervisor

log = logging.getLogger(__name__)


@dataclass
class Config:
    store_url: str
    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 8600
    artifact_roots: list[str] = field(default_factory=list)  # local dirs (resolved) or gs:// s3:// prefixes
    auth_token: str | None = None
    auth_predict: bool = False
    console: bool = True  # the browser console at /console (modelyard.web.console.platform_app)
    max_replicas: int = 8
    replica_args: list[str] = field(default_factory=list)
    autoscale: Policy = field(default_factory=Policy)
    engine: str = "local"  # "local": replicas are processes on this host; "ray": actors on a Ray cluster
    ray_address: str = ""
    ray_replica_cpus: float = 1.0
    warm_spare: bool = True  # local engine: keep one `modelyard serve` warm for the next replica
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # a control-plane request body (fields.py)
    max_predict_bytes: int = DEFAULT_MAX_PREDICT_BYTES  # a predict body, at the gateway and at each replica
    upstream_deadline: DeadlinePolicy = field(default_factory=DeadlinePolicy)  # a predict's wait for a replica
    readiness: Readiness = field(default_factory=Readiness)  # replicas' readiness probes (supervisor.py)
    # The Cloud Storage this platform serves: gs://B/N is storage_root/B/N (modelyard.platform.storage.local_file);
    # None when STORAGE_EMULATOR_HOST named another storage at start. storage_url is what children get.
    storage_root: Path | None = None
    job_limits: JobLimits | None = None  # what one job may use (jobs/job_limits.py); None: its defaults
    storage_url: str = ""


def make_engine(config: Config, store_id: str = "") -> LocalEngine | RayEngine:
    """The replica engine ``config.engine`` names (``ray`` must already be importable and reachable);
    ``store_id`` (``Store.identity``) marks every replica it starts, for the store's next leader."""
    if config.engine == "ray":
        return RayEngine(config.state_dir, config.ray_address, serve_args=config.replica_args,
                         num_cpus=config.ray_replica_cpus, store_id=store_id)
    return LocalEngine(config.state_dir, serve_args=config.replica_args, warm_spare=config.warm_spare,
                       store_id=store_id)


class Platform:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.store = Store(config.store_url)
        self.ops = Operations(self.store)
        self.routing = Routing()
        self.engine = make_engine(config, self.store.identity)
        self.metrics = Metrics()
        self.gateway = Gateway(self.routing, self.metrics, config.upstream_deadline)
        self.supervisor = Supervisor(self.store, self.engine, self.routing, readiness=config.readiness)
        self.supervisor.autoscaler = Autoscaler(config.autoscale)
        # Deployment resource pools: replicas shared by the models deployed into them (Ray actors on --engine ray).
        roots = [r for r in config.artifact_roots if "://" not in r]
        self.pools: Pools | None = (
            RayPools(self.store, self.routing, config.state_dir, self.engine, config.replica_args, roots,
                     self.store.identity) if config.engine == "ray" else
            Pools(self.store, self.routing, config.state_dir, config.host, config.replica_args, roots,
                  self.store.identity))
        self.pools.autoscaler = self.supervisor.autoscaler
        self.supervisor.pools = self.pools
        self.supervisor.on_lead = self.take_lead  # a follower taking over reconciles as a start does
        self.gateway.on_replica_failure = self.supervisor.replica_failed
        self._loop_task: asyncio.Task | None = None
        # Jobs (batch prediction, custom, tuning) run as children of the leading platform only.
        self.jobs = JobRunner(self.store, config.state_dir, lambda: self.supervisor.leader,
                              engine={"name": "ray", "address": config.ray_address} if config.engine == "ray" else None,
                              limits=config.job_limits)
        self.jobs.platform = self  # training pipelines upload their model through the API's code
        self._jobs_task: asyncio.Task | None = None
        self._ops_task: asyncio.Task | None = None  # operations' outcomes the store refused, written later
        # The data-plane process that answers predicts on the public port (dataplane/split.py), once the
        # server started it; None: predicts are answered in this process (the gateway above).
        self.dataplane = None

    def token_refusal(self, header: bytes | str | None) -> ApiError | None:
        """The API's UNAUTHENTICATED error for this ``Authorization`` header, or None when it may pass
        (the console asks this: web/ does not import the platform)."""
        try:
            check_bearer(self.config.auth_token, header)
        except ApiError as exc:
            return exc
        return None

    def refresh(self) -> None:
        self.routing.load(self.store)

    async def start(self) -> None:
        # The store's writer thread: its CPU policy and name (dataplane/priority.py: the one rule and why).
        await self.store.off_loop(priority.apply_to_this_thread, "store-writer")
        await self.engine.open()
        if self.pools is not None:
            await self.pools.open()
        self.refresh()
        if self.store.try_lead():
            await self.take_lead()
        else:
            await self.supervisor.sync_from_store()
            log.info("another platform supervises this store's replicas; this one serves the API and routes "
                     "(%d endpoint(s)), and takes over if that one stops", len(self.routing.endpoints))
        self._loop_task = asyncio.get_running_loop().create_task(self.supervisor.run())
        self._jobs_task = asyncio.get_running_loop().create_task(self.jobs.run())
        self._ops_task = asyncio.get_running_loop().create_task(self.ops.run())
        # Everything made at start (modules, the app, the routes) lives as long as the process: kept out
        # of the cyclic collector, so its full collections (which walked ~120,000 objects: a pause of tens
        # of milliseconds on the event loop, and more on a loaded machine) no longer hold up predicts.
        gc.freeze()

    async def take_lead(self) -> None:
        """Become the one platform supervising this store, which owns its replicas and unfinished
        operations: at a start that gets the lead, and when a follower takes over from a leader that
        stopped (kill -9 included; ``Supervisor.tick``). The same reconcile either way: adopt the
        replicas that serve, stop the rest and those a dead platform of this store started unlisted,
        then end the operations the dead platforms left pending."""
        self.supervisor.leader = True
        self.refresh()
        adopted, dropped = await self.supervisor.adopt()
        if self.pools is not None:
            pool_adopted, pool_dropped = await self.pools.adopt()
            adopted, dropped = adopted + pool_adopted, dropped + pool_dropped
        # After adopt(): it stops the replicas a cut-short undeploy left, so those undeploys end done.
        finished, aborted = self.ops.end_pending()
        log.info("platform state: %d endpoint(s), %d deployed model(s); replicas adopted %d, dropped %d; "
                 "unfinished operations: %d undeploy(s) completed, %d aborted", len(self.routing.endpoints),
                 len(self.routing.deployed), adopted, dropped, finished, aborted)

    async def stop(self) -> None:
        """Stop the control plane; replicas keep running, to be adopted by the next start."""
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self._jobs_task is not None:  # job processes keep running, adopted by the next start
            self._jobs_task.cancel()
        if self._ops_task is not None:
            self._ops_task.cancel()
        await self.gateway.close()
        await self.engine.close()
        if self.pools is not None:
            await self.pools.close()
        self.store.close()
