"""Deployment resource pools' replicas: ``modelyard serve`` processes that serve every model deployed
into their pool, each loaded on its first request and unloaded, least recently used first, under the
pool's memory budget (``serving/manager/on_demand.py`` does that inside each replica).

How a replica learns its models, without reopening the reload RPC (issue 43): the platform writes the
replica's ``--model_config_file`` in the replica's own directory under the platform's private state
directory (0700: only the platform's user can write there) when the replica starts, and appends each later
change (a deploy, an undeploy, a hot model to load ahead) as one line to the config's journal
(``--model_config_changes_file``, read every 0.1 s): a change costs O(1) in the pool's models. No network
call changes what a replica serves: its token still holds no ``admin`` scope, so
``HandleReloadConfigRequest`` and V2's repository load stay refused to everyone, and ``--model_roots``
confines the file's paths to the replica's directory and the platform's artifact roots. Each model is
served under its deployed model id, from ``models/<id>/1`` (a link to the model version's directory), so
the gateway sends ``/v1/models/<deployed model id>:predict``.

Placement: every replica of a pool knows every model of the pool; the gateway prefers, among the
replicas with the fewest requests in flight, one that has the model loaded already (what the probe
saw), so a model stays where it is loaded while it is cold, and spreads over the replicas when it is
hot (several requests in flight). A hot model (``load_ahead.py``: its request rate over a threshold) is
loaded ahead on the next replica too, so its spilled requests meet it loaded. A replica's loss costs only
the reloads of its models elsewhere.

The pool keeps ``minReplicaCount`` replicas (more, up to ``maxReplicaCount``, by the autoscaler's rule
on the requests in flight across all its models); dead replicas are replaced, and one unready for
``UNREADY_REPLACE_S`` is stopped and replaced. Replica rows are in the store (``state/pool_db``) as
soon as the process runs, with the same identity in its environment as any replica, so a restarted
platform adopts those that still answer and stops the rest. On the Ray engine (``RayPools``) the
replicas are Ray actors and each actor writes its replica's config file on its node.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from modelyard.platform.api import names
from modelyard.platform.api.errors import ApiError
from modelyard.platform.dataplane import replica_secrets
from modelyard.platform.dataplane.load_ahead import HotModels
from modelyard.platform.dataplane.pool_home import home_of
from modelyard.platform.dataplane.replicas import (PLATFORM_PID_ENV, READY_POLL_S, START_TIMEOUT_S, STATE_ENV,
                                                   STORE_ENV, child_alive, serve_env, stop_child, tail)
from modelyard.platform.dataplane.routing import Replica, Routing
from modelyard.platform.state import pool_db
from modelyard.ports import free_ports

log = logging.getLogger(__name__)

CONFIG_FILE = "models.config"
CHANGES_FILE = "models.changes"  # the config file's journal: one line a change (serving/manager/config_changes.py)
COMPACT_MIN_BYTES = 64 * 1024  # a journal shorter than this is never folded into the config file
MODELS_DIR = "models"
CONFIG_POLL_S = 1  # the replica re-reads its model config this often (whole seconds: serve's flag)
KNOW_TIMEOUT_S = 60.0  # a deploy waits this long for every replica of the pool to know the new model
PROBE_TIMEOUT_S = 2.0
UNREADY_REPLACE_S = 10.0
SWEEP_S = 5.0
PROBE_INTERVAL_S = 1.0  # how often replica rows of deleted pools are looked for
DRAIN_TIMEOUT_S = 60.0


def config_text(rdir: Path, model_ids: list[str]) -> str:
    """The ModelServerConfig of a pool replica serving ``model_ids`` (text format, TF Serving's)."""
    entries = "".join(f'  config {{ name: "{dm}" base_path: "{rdir / MODELS_DIR / dm}" '
                      'model_platform: "tensorflow" }\n' for dm in sorted(model_ids))
    return "model_config_list {\n" + entries + "}\n"


def write_config(rdir: Path, models: dict[str, Path], new: list[str] | None = None,
                 removed: list[str] = ()) -> None:
    """Tell the replica of ``rdir`` it serves ``models``. With ``new`` (the ids it does not know yet) and
    ``removed`` (those it no longer serves), a change: each new model's version directory is linked under
    ``rdir``/models/<id>/1 and one line per change is appended to the replica's journal
    (``--model_config_changes_file``, ``serving/manager/config_changes.py``), so a change costs O(1) in the
    pool's models. Without ``new``, or once the journal outgrows the config file (amortized O(1)), the whole
    set: every link, the config file replaced atomically (the replica never reads half of it), then the
    journal emptied. Links of models no longer listed stay until the replica stops (a request may hold one)."""
    for dm_id in (models if new is None else new):
        _link(rdir, dm_id, models[dm_id])
    config, journal = rdir / CONFIG_FILE, rdir / CHANGES_FILE
    if new is not None and config.exists():
        lines = "".join(json.dumps({"add": dm, "base_path": str(rdir / MODELS_DIR / dm)}) + "\n" for dm in new) + \
            "".join(json.dumps({"remove": dm}) + "\n" for dm in removed)
        if lines:
            with open(journal, "a", encoding="utf-8") as f:
                f.write(lines)  # one write: the replica reads only lines its newline ended
        if not _outgrown(config, journal):
            return
    tmp = rdir / (CONFIG_FILE + ".tmp")
    tmp.write_text(config_text(rdir, list(models)))
    os.replace(tmp, config)
    tmp = rdir / (CHANGES_FILE + ".tmp")  # emptied after the config holds every change: replaying it is harmless
    tmp.write_text("")
    os.replace(tmp, journal)


def write_load(rdir: Path, dm_id: str) -> None:
    """Ask the replica of ``rdir`` to load ``dm_id`` now, ahead of its requests (``load_ahead.py``)."""
    with open(rdir / CHANGES_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps({"load": dm_id}) + "\n")


def reads_journal(row: dict) -> bool:
    """Whether the local replica of ``row`` reads the config's journal (its command line says so); one whose
    command line cannot be read (gone, another host) is taken to, as every replica started since does."""
    try:
        with open(f"/proc/{int(row['pid'])}/cmdline", "rb") as f:
            return b"--model_config_changes_file" in f.read().split(b"\0")
    except (OSError, KeyError, TypeError, ValueError):
        return True


def _link(rdir: Path, dm_id: str, version_path: Path) -> None:
    base = rdir / MODELS_DIR / dm_id
    link = base / "1"
    if not link.is_symlink():
        base.mkdir(parents=True, exist_ok=True)
        link.symlink_to(version_path, target_is_directory=True)


def _outgrown(config: Path, journal: Path) -> bool:
    """The journal is longer than the config file it changes (and than a few lines): fold it in."""
    try:
        return journal.stat().st_size > max(config.stat().st_size, COMPACT_MIN_BYTES)
    except OSError:
        return True


@dataclass(eq=False)
class Pool:
    """One pool as the data plane sees it; quacks like a ``Deployed`` for the autoscaler (``id``,
    ``min_replicas``, ``max_replicas``, ``live()``, ``in_flight()``)."""
    row: dict
    replicas: list[Replica]  # the very list every deployed model of the pool routes over (Routing.pools)
    models: dict[str, Path] = field(default_factory=dict)  # deployed model id -> its version's directory
    starting: int = 0
    failed_at: float = -1e9
    # replica id -> the replica's on-demand state as last probed ({"models": {dm_id: {...}}, ...})
    states: dict[str, dict] = field(default_factory=dict)
    hot: HotModels = field(default_factory=HotModels)  # request rates per model; those loaded ahead

    @property
    def id(self) -> str:
        return "pool:" + self.row["id"]

    @property
    def min_replicas(self) -> int:
        return self.row["min_replicas"]

    @property
    def max_replicas(self) -> int:
        return self.row["max_replicas"]

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if not r.draining and not r.dead]

    def in_flight(self) -> int:
        return sum(r.outstanding for r in self.replicas)


class Pools:
    """Starts, probes, replaces, scales and stops the replicas of every deployment resource pool."""

    def __init__(self, store, routing: Routing, state_dir: Path, host: str = "127.0.0.1",
                 serve_args: list[str] | None = None, model_roots: list[str] | None = None,
                 store_id: str = "") -> None:
        self.store = store
        self.routing = routing
        self.state_dir = state_dir
        self.host = host
        self.serve_args = list(serve_args or [])
        # Local artifact roots: with none, the platform deploys any local directory, and so may its pools.
        self.model_roots = list(model_roots or [])
        self.store_id = store_id
        self.pools: dict[str, Pool] = {}
        self.autoscaler = None  # the platform's Autoscaler: desired(pool)
        self._children: dict[int, subprocess.Popen] = {}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task] = set()
        self._swept_at = time.monotonic()
        self._probed_at = 0.0

    # ---- lifecycle --------------------------------------------------------------------------------
    async def open(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S))

    async def close(self) -> None:
        """Replicas keep running (the next platform adopts them), as deployed models' replicas do."""
        for task in list(self._tasks):
            task.cancel()
        if self._session is not None:
            await self._session.close()

    def rows(self) -> list[dict]:
        """Every pool replica's row this platform knows (the orphan reaper keeps their processes)."""
        return [r.row for pool in self.pools.values() for r in pool.replicas] + pool_db.replicas(self.store)

    def load(self) -> None:
        """Follow the store: pools and the models deployed into them (a restart, another platform's change)."""
        rows = {row["id"]: row for row in pool_db.list_pools(self.store)}
        for pool_id in [p for p in self.pools if p not in rows]:
            self.pools.pop(pool_id)
        for pool_id, row in rows.items():
            pool = self.pools.get(pool_id)
            if pool is None:
                pool = self.pools[pool_id] = Pool(row, self.routing.pools.setdefault(pool_id, []))
            pool.row = row
        for dm in self.store.deployed_models():
            pool = self.pools.get(dm.get("pool_id") or "")
            if pool is not None and dm["id"] not in pool.models:
                pool.models[dm["id"]] = Path(self.store.get_version(dm["model_id"], dm["version_id"])["local_path"])

    async def adopt(self) -> tuple[int, int]:
        """At the lead: re-attach pool replicas that still answer (their config rewritten: models may have
        changed meanwhile), stop and forget the others. Returns (adopted, dropped)."""
        self.load()
        adopted = dropped = 0
        routed = {r.id for pool in self.pools.values() for r in pool.replicas}
        for row in pool_db.replicas(self.store):
            pool = self.pools.get(row["pool_id"])
            if row["id"] in routed:
                continue
            if pool is not None and self.alive(row) and await self._answers(row):
                self._tell(row, pool)
                pool.replicas.append(Replica(row))
                adopted += 1
            else:
                await self.stop(row, grace_s=5)
                pool_db.remove_replica(self.store, row["id"])
                dropped += 1
        return adopted, dropped

    async def follow(self) -> None:
        """On a follower (another platform of the store, not supervising): route to the pool replicas the
        leader keeps, those of the store's rows that answer; a row that vanished leaves routing."""
        rows = pool_db.replicas(self.store)
        listed = {row["id"] for row in rows}
        for replicas in self.routing.pools.values():
            replicas[:] = [r for r in replicas if r.id in listed]  # in place: the list is shared by the models
        for row in rows:
            replicas = self.routing.pools.setdefault(row["pool_id"], [])
            if row["id"] not in {r.id for r in replicas} and await self._answers(row):
                replicas.append(Replica(row))

    # ---- processes (RayPools: actors) -------------------------------------------------------------------
    def _tell(self, row: dict, pool: Pool, new: list[str] | None = None, removed: list[str] = ()) -> None:
        """The replica of ``row`` serves ``pool.models`` from now on (``new``: those it does not know yet,
        ``removed``: those it served; neither given: the whole set)."""
        if new is not None and not reads_journal(row):
            new = None  # a replica started before the journal (adopted after an upgrade): the whole config, as then
        write_config(Path(row["log_path"]).parent, pool.models, new=new, removed=removed)

    def _tell_load(self, row: dict, dm_id: str) -> None:
        """The replica of ``row`` loads ``dm_id`` now (it is hot), not on its next request."""
        write_load(Path(row["log_path"]).parent, dm_id)

    def _load_ahead(self, pool: Pool, now: float) -> None:
        """Each hot model loaded on its ``copies`` replicas (``load_ahead.py``): those the last probe saw
        without it are told to load it."""
        hot = pool.hot.update(now)
        if not hot or len(pool.replicas) < 2:
            return
        ids = [r.id for r in pool.replicas]  # all of them, in order: the gateway counts homes so
        usable = {r.id: r for r in pool.live() if r.unready_since is None}
        for dm_id in hot:
            if dm_id not in pool.models:
                continue
            for rid in pool.hot.targets(home_of(dm_id), ids):
                seen = ((pool.states.get(rid) or {}).get("models") or {}).get(dm_id) or {}
                if rid in usable and not seen.get("loaded") and pool.hot.should_tell(rid, dm_id, now):
                    log.info("deployed model %s of pool %s is hot (%.0f requests/s): loading it ahead on replica %s",
                             dm_id, pool.row["id"], pool.hot.rate(dm_id, now), rid)
                    self._tell_load(usable[rid].row, dm_id)

    def _flags(self, pool: Pool) -> list[str]:
        """A pool replica's ``modelyard serve`` flags beyond its config file, address, token and roots."""
        return ["--model_config_file_poll_wait_seconds", str(CONFIG_POLL_S), "--file_system_poll_wait_seconds", "0",
                "--model_config_changes_file", CHANGES_FILE,
                "--json_numbers", "vertex", *self.serve_args,
                "--load_models_on_demand", "true", "--model_memory_budget_bytes", str(pool.row["budget_bytes"])]

    async def _begin(self, pool: Pool, replica_id: str) -> dict:
        """Start a replica's process; its row (stored next) once it runs."""
        return self._launch(pool, replica_id)

    async def _log_tail(self, row: dict) -> str:
        return tail(Path(row["log_path"]))

    def _launch(self, pool: Pool, replica_id: str) -> dict:
        rdir = self.state_dir / "pools" / pool.row["id"] / replica_id
        rdir.mkdir(parents=True, exist_ok=True)
        write_config(rdir, pool.models)
        port, grpc_port = free_ports(2, self.host)
        log_path = rdir / "serve.log"
        token_file = replica_secrets.write_token_file(rdir, replica_secrets.new_secret())
        cmd = [*_serve_head(), "--model_config_file", str(rdir / CONFIG_FILE),
               "--host", self.host, "--rest_api_port", str(port), "--port", str(grpc_port), *self._flags(pool)]
        # The replica's own directory, the local artifact roots and the platform's copies of remote artifacts
        # (artifacts.resolve): no config may name anything else. With no local root the platform deploys any
        # local directory, and so may the pool's replicas.
        cache = self.state_dir / "artifacts"
        cache.mkdir(parents=True, exist_ok=True)
        cmd += replica_secrets.serve_flags(token_file, [rdir, cache, *self.model_roots]) if self.model_roots else \
            [replica_secrets.FLAG, str(token_file)]
        identity = {STATE_ENV: str(self.state_dir), STORE_ENV: self.store_id, PLATFORM_PID_ENV: str(os.getpid())}
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env={**serve_env(), **identity}, start_new_session=True)
        self._children[proc.pid] = proc
        return {"id": replica_id, "pool_id": pool.row["id"], "host": self.host, "port": port, "grpc_port": grpc_port,
                "pid": proc.pid, "log_path": str(log_path), "created": time.time()}

    def alive(self, row: dict) -> bool:
        return child_alive(self._children, row)

    async def stop(self, row: dict, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; returns once the process is gone."""
        await stop_child(self._children, row, grace_s)

    async def _get(self, row: dict, path: str) -> tuple[int, dict | None]:
        assert self._session is not None
        auth = replica_secrets.authorization(row)
        try:
            async with self._session.get(f"http://{row['host']}:{row['port']}{path}",
                                         headers={"Authorization": auth.decode()} if auth else None) as resp:
                body = await resp.json(content_type=None)
                return resp.status, body if isinstance(body, dict) else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return 0, None

    async def _answers(self, row: dict) -> bool:
        return (await self._get(row, "/v1/models"))[0] == 200

    async def _start_one(self, pool: Pool) -> Replica:
        """A new replica of ``pool``, its row stored while it starts, routed once it answers."""
        replica_id = names.new_id()
        row = await self._begin(pool, replica_id)
        try:
            pool_db.add_replica(self.store, row)
        except BaseException:
            await self.stop(row, grace_s=5)
            raise
        deadline = time.monotonic() + START_TIMEOUT_S
        while not await self._answers(row):
            if not self.alive(row) or time.monotonic() > deadline:
                why = await self._log_tail(row)
                await self.stop(row, grace_s=5)
                pool_db.remove_replica(self.store, row["id"])
                raise ApiError("FAILED_PRECONDITION", f"a replica of deployment resource pool {pool.row['id']} "
                               f"did not start: {why}")
            await asyncio.sleep(READY_POLL_S)
        replica = Replica(row)
        pool.replicas.append(replica)
        return replica

    async def grow(self, pool: Pool, count: int) -> None:
        """Start ``count`` replicas at once; all or nothing (those started are stopped on a failure)."""
        pool.starting += count
        try:
            results = await asyncio.gather(*(self._start_one(pool) for _ in range(count)), return_exceptions=True)
        finally:
            pool.starting -= count
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for r in results:
                if isinstance(r, Replica):
                    await self.retire(pool, r, drain=False)
            raise errors[0]

    async def retire(self, pool: Pool, replica: Replica, drain: bool = True) -> None:
        replica.draining = True
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while drain and replica.outstanding and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self.stop(replica.row)
        pool_db.remove_replica(self.store, replica.id)
        if replica in pool.replicas:
            pool.replicas.remove(replica)
        pool.states.pop(replica.id, None)
        pool.hot.forget_replica(replica.id)
        if replica.upstream is not None:
            replica.upstream.close()

    # ---- pools and their models --------------------------------------------------------------------
    async def create(self, row: dict) -> None:
        """Start the new pool's ``min_replicas`` replicas; returns once they answer."""
        pool = self.pools.get(row["id"]) or Pool(row, self.routing.pools.setdefault(row["id"], []))
        self.pools[row["id"]] = pool
        await self.grow(pool, row["min_replicas"])

    async def delete(self, pool_id: str) -> None:
        pool = self.pools.pop(pool_id, None)
        if pool is not None:
            for replica in list(pool.replicas):
                await self.retire(pool, replica, drain=False)
        for row in pool_db.replicas(self.store, pool_id):  # rows of replicas never routed here
            await self.stop(row)
            pool_db.remove_replica(self.store, row["id"])
        self.routing.pools.pop(pool_id, None)

    def pool(self, pool_id: str) -> Pool:
        pool = self.pools.get(pool_id)
        if pool is None:
            self.load()
            pool = self.pools.get(pool_id)
        if pool is None:
            raise ApiError("NOT_FOUND", f"DeploymentResourcePool {pool_id} not found.")
        return pool

    async def add_model(self, pool_id: str, dm_id: str, version_path: Path) -> None:
        """Make every live replica of the pool serve ``dm_id`` (loaded on its first request); returns once
        each says it knows the model, so the deploy's first predict finds it wherever it lands."""
        pool = self.pool(pool_id)
        pool.models[dm_id] = version_path
        replicas = pool.live()
        if not replicas:
            raise ApiError("UNAVAILABLE", f"DeploymentResourcePool {pool_id} has no live replica yet; retry shortly")
        for r in replicas:
            self._tell(r.row, pool, new=[dm_id])
        deadline = time.monotonic() + KNOW_TIMEOUT_S
        waiting = list(replicas)
        while waiting:
            waiting = [r for r in waiting if not r.dead and (await self._get(r.row, f"/v1/models/{dm_id}"))[0] != 200]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ApiError("DEADLINE_EXCEEDED", f"replica(s) {', '.join(r.id for r in waiting)} of deployment "
                               f"resource pool {pool_id} did not take model {dm_id} within {KNOW_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.1)

    def remove_model(self, pool_id: str, dm_id: str) -> None:
        """The pool's replicas stop serving ``dm_id`` (they unload it once its requests in flight end)."""
        pool = self.pools.get(pool_id)
        if pool is None or pool.models.pop(dm_id, None) is None:
            return
        for r in pool.replicas:
            if not r.dead:
                self._tell(r.row, pool, new=[], removed=[dm_id])

    # ---- the leader's timer ------------------------------------------------------------------------
    async def tick(self) -> None:
        """Replace dead and stuck replicas, scale to the autoscaler's count, probe each replica's models
        (once every ``PROBE_INTERVAL_S``: a listing of a thousand models is not free)."""
        now = time.monotonic()
        probe = now - self._probed_at >= PROBE_INTERVAL_S
        if probe:
            self._probed_at = now
        if now - self._swept_at >= SWEEP_S:
            self._swept_at = now
            self._spawn(self._sweep())
        for pool in list(self.pools.values()):
            for r in list(pool.replicas):
                if r.draining:
                    continue
                if r.dead or not self.alive(r.row):
                    log.warning("replica %s of deployment resource pool %s died; replacing it", r.id, pool.row["id"])
                    r.dead = True
                    self._spawn(self.retire(pool, r, drain=False))
                elif r.unready_since is not None and now - r.unready_since >= UNREADY_REPLACE_S:
                    log.warning("replica %s of deployment resource pool %s stayed unready; replacing it", r.id,
                                pool.row["id"])
                    self._spawn(self.retire(pool, r, drain=False))
                elif probe and not r.probing:
                    r.probing = True
                    self._spawn(self._probe(pool, r))
            if probe:
                self._load_ahead(pool, now)
            want = self.autoscaler.desired(pool) if self.autoscaler else pool.min_replicas
            want = max(pool.min_replicas, min(pool.max_replicas, want))
            have = len(pool.live()) + pool.starting
            if have < want and now - pool.failed_at > 10.0:
                self._spawn(self._grow_logged(pool, want - have))
            elif have > want and not pool.starting:
                victim = min(pool.live(), key=lambda r: r.outstanding)
                log.info("scaling deployment resource pool %s down to %d replica(s)", pool.row["id"], want)
                self._spawn(self.retire(pool, victim))

    async def _sweep(self) -> None:
        """Replica rows of pools that are gone (a replica started while its pool was being deleted): stopped."""
        known = {r.id for pool in self.pools.values() for r in pool.replicas}
        for row in pool_db.replicas(self.store):
            if row["pool_id"] not in self.pools and row["id"] not in known:
                log.warning("stopping replica %s of deployment resource pool %s, which is gone", row["id"],
                            row["pool_id"])
                await self.stop(row, grace_s=5)
                pool_db.remove_replica(self.store, row["id"])

    async def _grow_logged(self, pool: Pool, count: int) -> None:
        try:
            await self.grow(pool, count)
        except Exception as exc:
            pool.failed_at = time.monotonic()
            log.error("could not start replicas of deployment resource pool %s: %s", pool.row["id"],
                      getattr(exc, "message", exc))

    async def _probe(self, pool: Pool, r: Replica) -> None:
        """The replica's on-demand state, only what changed since the last probe (``GET /v1/on_demand?since=``:
        a pool of a thousand models is probed for what its active ones did, not listed whole every second);
        answered, the replica is ready. A replica that predates that call is listed whole (``GET /v1/models``)."""
        last = pool.states.get(r.id)
        try:
            status, body = await self._get(r.row, "/v1/on_demand" + (f"?since={last['seq']}" if last and
                                                                      "seq" in last else ""))
            if status == 400:
                status, body = await self._get(r.row, "/v1/models")
                body = (body or {}).get("on_demand") if status == 200 else None
        finally:
            r.probing = False
        if status == 200 and body is not None:
            r.unready_since = None
            changed = body.get("models") or {}
            if last is not None and "seq" in body and "seq" in last:
                models = last.get("models") or {}
                models.update(changed)  # in place: what did not change stays as last seen, O(changed)
                body["models"] = models
            pool.states[r.id] = body
            pool.hot.observe(r.id, {dm: m.get("requests", 0) for dm, m in changed.items()}, time.monotonic())
        elif r.unready_since is None and not (r.draining or r.dead):
            r.unready_since, r.unready_served = time.monotonic(), r.served

    def model_state(self, pool_id: str, dm_id: str) -> dict:
        """One pooled model as the last probes saw it (the console shows it): the replicas it is loaded on,
        its loads and unloads over the pool, its last load's seconds, and how long since a request used it."""
        pool = self.pools.get(pool_id)
        seen = [(rid, (st.get("models") or {}).get(dm_id) or {}) for rid, st in (pool.states.items() if pool else ())]
        idle = [m["idle_seconds"] for _, m in seen if m.get("loaded") and "idle_seconds" in m]
        return {"pool": pool_id, "loadedOn": sorted(rid for rid, m in seen if m.get("loaded")),
                "loads": sum(m.get("loads", 0) for _, m in seen), "unloads": sum(m.get("unloads", 0) for _, m in seen),
                "lastLoadSeconds": max((m.get("load_seconds", 0.0) for _, m in seen), default=0.0),
                "idleSeconds": min(idle) if idle else None}

    def render_metrics(self) -> str:
        """Prometheus text of every pool: its replicas, and per replica and model what the last probe saw
        (loaded or not, loads, unloads, the last load's seconds; the most models resident at once)."""
        out = ["# HELP modelyard_pool_replicas live replicas of a deployment resource pool",
               "# TYPE modelyard_pool_replicas gauge"]
        for pool in self.pools.values():
            out.append(f'modelyard_pool_replicas{{pool="{pool.row["id"]}"}} {len(pool.live())}')
        families = (("modelyard_pool_models_resident", "gauge", "models loaded (or loading) on a pool replica",
                     "resident_models"),
                    ("modelyard_pool_models_resident_peak", "gauge", "most models loaded at once on a pool replica",
                     "peak_resident_models"),
                    ("modelyard_pool_resident_bytes", "gauge",
                     "what the models loaded on a pool replica weigh against its budget (bytes)",
                     "resident_bytes"))
        for name, kind, help_, key in families:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            for pool in self.pools.values():
                for rid, st in sorted(pool.states.items()):
                    out.append(f'{name}{{pool="{pool.row["id"]}",replica="{rid}"}} {st.get(key, 0)}')
        per_model = (("modelyard_pool_model_loads_total", "counter", "loads of a model on a pool replica", "loads"),
                     ("modelyard_pool_model_unloads_total", "counter", "unloads of a model on a pool replica (least "
                      "recently used, to make room)", "unloads"),
                     ("modelyard_pool_model_loaded", "gauge", "1 while the model is loaded on the replica", "loaded"),
                     ("modelyard_pool_model_load_seconds", "gauge", "how long the model's last load took",
                      "load_seconds"),
                     ("modelyard_pool_model_idle_seconds", "gauge", "seconds since a request last used the loaded "
                      "model", "idle_seconds"))
        for name, kind, help_, key in per_model:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            for pool in self.pools.values():
                for rid, st in sorted(pool.states.items()):
                    for dm_id, m in sorted((st.get("models") or {}).items()):
                        if dm_id in pool.models and key in m:
                            value = m[key] if key.endswith("seconds") else int(m[key])
                            out.append(f'{name}{{pool="{pool.row["id"]}",replica="{rid}",deployed_model="{dm_id}"}} '
                                       f'{value}')
        return "\n".join(out) + "\n"

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class RayPools(Pools):
    """Pools on the Ray engine (``--engine ray``): each pool replica is a detached Ray actor
    (``replicas_ray.PoolReplicaActor``) that Ray places as it places any replica (SPREAD over the nodes,
    ``--ray-replica-cpus`` each), so a pool of two replicas spans two nodes when they have the CPUs, and a
    node's loss costs only reloads on the other. Nodes share no disk with the platform: each model version
    is published to object storage by content hash (``artifact_cache.publish``, as for a deployed model's
    replicas), and the platform tells each actor the pool's models by an actor call (``set_models``: the
    whole set, ordered); the actor fetches the files into its node's cache and writes its replica's private
    ``--model_config_file`` on its node, which the replica re-reads as a local pool replica does. The replica
    still takes no admin RPC. Routing, probes, scaling and adoption are ``Pools``' own."""

    def __init__(self, store, routing: Routing, state_dir: Path, engine, serve_args: list[str] | None = None,
                 model_roots: list[str] | None = None, store_id: str = "") -> None:
        super().__init__(store, routing, state_dir, serve_args=serve_args, model_roots=model_roots,
                         store_id=store_id)
        self.engine = engine  # replicas_ray.RayEngine: its actors, their watches and secrets
        self.sources: dict[str, dict] = {}  # a model version's directory -> artifact_cache.Source.as_dict()

    async def _publish(self, paths) -> None:
        from modelyard.platform.dataplane import artifact_cache

        for path in {str(p) for p in paths} - set(self.sources):
            try:
                self.sources[path] = (await asyncio.to_thread(artifact_cache.publish, Path(path))).as_dict()
            except artifact_cache.ArtifactError as exc:
                raise ApiError("FAILED_PRECONDITION", f"model files {path} cannot reach the Ray nodes: {exc}") from None

    def _sources(self, pool: Pool) -> dict[str, dict]:
        return {dm: self.sources[str(path)] for dm, path in pool.models.items() if str(path) in self.sources}

    def _tell(self, row: dict, pool: Pool, new: list[str] | None = None, removed: list[str] = ()) -> None:
        self.engine.tell_models(row["id"], self._sources(pool))

    def _tell_load(self, row: dict, dm_id: str) -> None:
        self.engine.tell_load(row["id"], dm_id)

    async def _begin(self, pool: Pool, replica_id: str) -> dict:
        await self._publish(pool.models.values())
        # The platform's local artifact roots and its copies of remote artifacts, as a local pool replica's;
        # the actor adds its own directory and its node's cache. None: any local directory, as the platform.
        roots = [str(self.state_dir / "artifacts"), *self.model_roots] if self.model_roots else None
        return await self.engine.start_pool_replica(replica_id, pool.row["id"], self._sources(pool), self._flags(pool),
                                                    roots)

    async def add_model(self, pool_id: str, dm_id: str, version_path: Path) -> None:
        """Each replica's actor is told the new set and answers once its node has the files (a node that
        cannot fetch them fails the deploy saying why, at once), then each replica must list the model."""
        await self._publish([version_path])
        pool = self.pool(pool_id)
        pool.models[dm_id] = version_path  # a deploy that does not commit takes it out again (remove_model)
        await asyncio.gather(*(self.engine.set_models(r.id, self._sources(pool), KNOW_TIMEOUT_S)
                               for r in pool.live()))
        await super().add_model(pool_id, dm_id, version_path)

    async def adopt(self) -> tuple[int, int]:
        self.load()
        await self._publish(path for pool in self.pools.values() for path in pool.models.values())
        return await super().adopt()

    async def _answers(self, row: dict) -> bool:
        await self.engine.learn_secret(row)  # an adopted or followed actor's: it says it
        return await super()._answers(row)

    async def _log_tail(self, row: dict) -> str:
        return await self.engine.log_tail(row)

    def alive(self, row: dict) -> bool:
        return self.engine.alive(row)

    async def stop(self, row: dict, grace_s: float = 10.0) -> None:
        await self.engine.stop(row, grace_s)


def _serve_head() -> list[str]:
    import sys

    return [sys.executable, "-m", "modelyard", "serve"]
