"""Keeps each deployed model's replicas alive, ready and counted: adoption at start, readiness
probes, replacement of dead and stuck replicas, starting and draining replicas for deploys,
undeploys and the autoscaler.

Readiness, not liveness: a replica whose process runs may still be stuck (stopped, swapped out,
deadlocked). Every ``Readiness.interval_s`` each replica's model status is asked with a deadline;
a replica that misses it, and answered no predict meanwhile, is taken out of routing at once (as
is one the gateway saw time out); it is re-admitted when it answers again, and a replica unready
for ``Readiness.replace_after_s`` is killed and replaced (the warm spare takes its place).

A replica's row is written to the store as soon as its process is up, and each replica carries its
platform's identity from before it starts (the local engine's environment marker, the Ray actor's
owner), so a platform that dies leaves no untracked process: the next one adopts replicas of
deployed models that still answer, and stops the rest (replicas of a deploy that never committed,
and replicas started before their row was written: ``reap_orphans``, at start and on the leader's
timer, since a Ray actor not yet placed at the start can say its owner only later). The same rules hold for both
engines: the readiness probe and the replacement of stuck replicas only ask the engine's
``healthy``/``stop``, so a stopped serve process of a Ray actor is taken out of routing and replaced
as a local one is.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from modelyard.platform.api import names
from modelyard.platform.dataplane.replicas import START_TIMEOUT_S, LocalEngine
from modelyard.platform.dataplane.replicas_ray import RayEngine
from modelyard.platform.dataplane.routing import Deployed, Replica, Routing
from modelyard.platform.state.store import Store
from modelyard.platform.dataplane.upstream import UpstreamTimeout

log = logging.getLogger(__name__)

RETRY_AFTER_FAILURE_S = 10.0
STUCK_STOP_GRACE_S = 1.0
RECONCILE_INTERVAL_S = 5.0  # the store's replica rows against the processes that run  # a stuck replica gets little time for SIGTERM: it is not answering anyway


@dataclass(frozen=True)
class Readiness:
    interval_s: float = 1.0  # how often each replica's readiness is probed
    deadline_s: float = 1.0  # --readiness-deadline-seconds: a probe unanswered by then is a miss
    replace_after_s: float = 5.0  # --replace-unready-after-seconds: unready that long, it is replaced
SYNC_INTERVAL_S = 1.0
DRAIN_TIMEOUT_S = 60.0


class Supervisor:
    def __init__(self, store: Store, engine: LocalEngine | RayEngine, routing: Routing, interval_s: float = 0.25,
                 readiness: Readiness = Readiness()) -> None:
        self.store = store
        self.readiness = readiness
        self._probed_at = 0.0
        self._reconciled_at = time.monotonic()  # the first pass after adopt() has settled
        self.engine = engine
        self.routing = routing
        self.interval_s = interval_s
        self.autoscaler = None  # set by the platform: desired(d) -> int
        self.pools = None  # set by the platform: deployment resource pools' replicas (dataplane/pools.py)
        self._starting: dict[str, int] = {}
        self._failed_at: dict[str, float] = {}
        self._tasks: set[asyncio.Task] = set()
        self._starting_ids: set[str] = set()  # stored but not yet routed (a deploy in progress)
        self._retiring: set[str] = set()  # being drained and stopped (an undeploy, a scale-down)
        self._synced_at = 0.0
        self._reaping: asyncio.Task | None = None  # the timer's reap_orphans, one at a time
        self.leader = False
        # What becoming the leader runs (the platform's ``take_lead``: adopt, then end what dead platforms
        # left pending), at its start and when a follower takes over from a leader that stopped.
        self.on_lead: Callable[[], Awaitable[None]] | None = None

    # ---- several platforms on one store -----------------------------------------------------------
    async def sync_from_store(self) -> None:
        """Routing from the store, and replicas that another platform started (alive per HTTP)."""
        self.routing.load(self.store)
        known = {r.id for d in self.routing.deployed.values() for r in d.replicas}
        for row in self.store.replicas():
            d = self.routing.deployed.get(row["deployed_model_id"])
            if d is None or row["id"] in known or row["id"] in self._starting_ids:
                continue
            if await self.engine.healthy(row) and row["id"] not in {r.id for r in d.replicas}:
                self.routing.add_replica(d.id, row)
        if not self.leader and self.pools is not None:  # pools' replicas too, as the leader keeps them
            await self.pools.follow()
        if not self.leader:  # a follower routes only to replicas the store still lists
            listed = {row["id"] for row in self.store.replicas()}
            for d in self.routing.deployed.values():
                if not d.pool_id:  # a pool's list is shared by its models: the pool keeps it
                    d.replicas = [r for r in d.replicas if r.id in listed]

    # ---- start-up -------------------------------------------------------------------------------
    async def adopt(self) -> tuple[int, int]:
        """Re-attach replicas that still serve; stop and forget the others. Returns (adopted, dropped).
        At a start nothing is routed yet; a follower taking the lead already routes the replicas the
        store listed (``sync_from_store``): those are re-attached in place, or taken out of routing."""
        adopted = dropped = 0
        routed = {r.id: r for d in self.routing.deployed.values() for r in d.replicas}
        for row in self.store.replicas():
            if row["id"] in self._starting_ids:  # this platform's own deploy in progress: not a leftover
                continue
            keep = row["deployed_model_id"] in self.routing.deployed and await self.engine.adopt(row)
            if keep:
                if row["id"] not in routed:
                    self.routing.add_replica(row["deployed_model_id"], row)
                adopted += 1
            else:
                if row["id"] in routed:
                    self.routing.remove_replica(routed[row["id"]])
                await self.engine.stop(row, grace_s=5)
                self.store.remove_replica(row["id"])
                dropped += 1
        await self.reap_orphans()
        return adopted, dropped

    async def reap_orphans(self) -> None:
        """Replicas a dead platform started that no row lists (its replicas' rows come first): stopped.
        One rule for both engines; each finds what a platform of this state directory started (local
        processes by their environment, Ray actors by the owner they were created with)."""
        keep = [r.row for d in self.routing.deployed.values() for r in d.replicas] + self.store.replicas()
        if self.pools is not None:
            keep += self.pools.rows()
        killed = await self.engine.reap_orphans(keep)
        if killed:
            log.warning("stopped %d replica(s) a previous platform started and no store row lists", killed)

    async def _reap_on_timer(self) -> None:
        try:
            await self.reap_orphans()
        except Exception:  # the next timer tries again
            log.exception("looking for orphan replicas failed")

    # ---- replicas ---------------------------------------------------------------------------
    async def start_replicas(self, dm_id: str, model_path: Path, count: int, use_spare: bool = False) -> list[dict]:
        """Start ``count`` replicas at once; each row is stored when its process is up. All or nothing.
        ``use_spare``: needed fast (scale-up, replacement): the engine's warm spare may take one."""
        results = await asyncio.gather(*(self._start_one(dm_id, model_path, use_spare) for _ in range(count)),
                                       return_exceptions=True)
        rows = [r for r in results if isinstance(r, dict)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for row in rows:
                await self.discard(row)
            raise errors[0]
        return rows

    async def _start_one(self, dm_id: str, model_path: Path, use_spare: bool) -> dict:
        replica_id = names.new_id()
        self._starting_ids.add(replica_id)
        row = await self.engine.start(replica_id, dm_id, model_path, use_spare=use_spare)
        try:
            self.store.add_replica(row)
        except BaseException:  # the store refused its row (disk full ...): no process may run unlisted
            await self.engine.stop(row, grace_s=5)
            self.started(row)
            raise
        return row

    async def discard(self, row: dict) -> None:
        """Stop a replica that will not serve (its deploy failed) and forget its row; a row the store
        cannot delete now is deleted by ``reconcile_replicas`` later (its process is gone by then)."""
        try:
            await self.engine.stop(row)
            try:
                self.store.remove_replica(row["id"])
            except Exception as exc:
                log.error("replica %s is stopped, but the store could not forget it (%s); retried later",
                          row["id"], exc)
        finally:
            self.started(row)

    async def reconcile_replicas(self) -> None:
        """The store's replica rows against what runs: a row whose process is gone, or that belongs to no
        deployed model (its deploy ended without committing, even in another platform, long enough ago),
        is stopped and forgotten. On the leader's timer."""
        routed = {r.id for d in self.routing.deployed.values() for r in d.replicas}
        for row in self.store.replicas():
            if row["id"] in routed or row["id"] in self._starting_ids or row["id"] in self._retiring:
                continue
            deployed = row["deployed_model_id"] in self.routing.deployed
            stale = time.time() - row["created"] > START_TIMEOUT_S + 60
            if not self.engine.alive(row) or (not deployed and stale):
                log.warning("replica %s (deployed model %s) is listed but %s; stopping and forgetting it",
                            row["id"], row["deployed_model_id"],
                            "its process is gone" if not self.engine.alive(row) else "its model is not deployed")
                await self.engine.stop(row, grace_s=5)
                self.store.remove_replica(row["id"])

    def started(self, row: dict) -> None:
        """``row``'s replica is routed now (or given up): syncing may treat it as any other."""
        self._starting_ids.discard(row["id"])

    async def retire(self, replica: Replica, drain: bool = True) -> None:
        """Take ``replica`` out of rotation, wait for its in-flight requests, stop it, forget it."""
        replica.draining = True
        self._retiring.add(replica.id)  # no longer routed (an undeploy): reconcile_replicas leaves it to us
        try:
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while drain and replica.outstanding and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await self.engine.stop(replica.row)
            self.store.remove_replica(replica.id)
            self.routing.remove_replica(replica)
        finally:
            self._retiring.discard(replica.id)

    async def retire_all(self, replicas: list[Replica]) -> None:
        """Retire ``replicas`` one after the other (an undeploy), all marked as leaving from the start."""
        self._retiring.update(r.id for r in replicas)
        try:
            for replica in replicas:
                await self.retire(replica)
        finally:
            self._retiring.difference_update(r.id for r in replicas)

    def replica_failed(self, replica: Replica, exc: Exception | None = None) -> None:
        """The gateway could not reach ``replica``: if its process is gone, stop routing to it now; if it
        did not answer in time, no new request goes to it until a readiness probe says it is ready."""
        if not replica.dead and not self.engine.alive(replica.row):
            replica.dead = True
        elif isinstance(exc, UpstreamTimeout) and replica.unready_since is None:
            log.warning("replica %s did not answer a predict in time; out of routing until it is ready", replica.id)
            replica.unready_since, replica.unready_served = time.monotonic(), replica.served

    # ---- readiness ------------------------------------------------------------------------------
    def _probe_all(self) -> None:
        for d in self.routing.deployed.values():
            if d.pool_id:  # a pool's replicas are probed by the pool (dataplane/pools.py)
                continue
            for r in d.replicas:
                if not (r.draining or r.dead or r.probing):
                    r.probing = True
                    self._spawn(self._probe(r))

    async def _probe(self, r: Replica) -> None:
        served = r.served
        try:
            ready = await asyncio.wait_for(self.engine.healthy(r.row), self.readiness.deadline_s)
        except Exception:  # a timeout, or a replica whose engine cannot say: not ready
            ready = False
        finally:
            r.probing = False
        if ready:
            if r.unready_since is not None:
                log.info("replica %s is ready again after %.1f s; back in routing", r.id,
                         time.monotonic() - r.unready_since)
            r.unready_since = None
        elif r.unready_since is None and r.served == served and not (r.draining or r.dead):
            # No status within the deadline and no predict answered meanwhile either: stuck, or not serving.
            log.warning("replica %s missed its readiness deadline (%.1f s); out of routing", r.id,
                        self.readiness.deadline_s)
            r.unready_since, r.unready_served = time.monotonic(), r.served

    async def _replace_stuck(self, r: Replica) -> None:
        """Kill a replica that stayed unready (its requests were retried elsewhere) and forget it; the
        next tick starts its replacement."""
        try:
            await self.engine.stop(r.row, grace_s=STUCK_STOP_GRACE_S)
        finally:
            self.store.remove_replica(r.id)
            self.routing.remove_replica(r)

    # ---- the loop -------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # the supervisor must outlive any one bad tick
                log.exception("supervisor tick failed")
            await asyncio.sleep(self.interval_s)

    async def tick(self) -> None:
        """The leader (one per store) keeps replicas alive and scaled; every platform, leader or not,
        picks up what other platforms on the same store changed (deployments, replicas) once a second."""
        now = time.monotonic()
        if now - self._synced_at >= SYNC_INTERVAL_S:
            self._synced_at = now
            if not self.leader and self.store.try_lead():
                log.info("this platform now supervises the replicas of this store (the leader before it stopped)")
                self.leader = True
                if self.on_lead is not None:
                    await self.on_lead()
                else:
                    await self.adopt()
            await self.sync_from_store()
        if now - self._probed_at >= self.readiness.interval_s:
            self._probed_at = now
            self._probe_all()
        if not self.leader:
            return
        if now - self._reconciled_at >= RECONCILE_INTERVAL_S:
            self._reconciled_at = now
            await self.reconcile_replicas()
            # Orphans are looked for on the timer too, not only at start: a Ray actor a killed platform had
            # created but Ray had not placed yet (no free CPU) cannot say its owner at our start, and gets
            # placed later (when a CPU frees), holding that CPU for ever unless something ends it then.
            # In the background: asking such an actor waits OWNER_TIMEOUT_S.
            if self._reaping is None or self._reaping.done():
                self._reaping = asyncio.get_running_loop().create_task(self._reap_on_timer())
        # A warm spare replica while anything is deployed: the next replica (scale-up, replacement) is up in ~1 s.
        self.engine.want_spare(bool(self._starting_ids) or any(not d.pool_id for d in self.routing.deployed.values()))
        if self.pools is not None:
            await self.pools.tick()
        for d in list(self.routing.deployed.values()):
            if d.pool_id:  # its replicas are its pool's, kept by the pool
                continue
            for r in list(d.replicas):
                if not r.draining and (r.dead or not self.engine.alive(r.row)):
                    log.warning("replica %s of deployed model %s died; replacing it", r.id, d.id)
                    r.dead = True
                    self.routing.remove_replica(r)
                    self.store.remove_replica(r.id)
                elif r.unready_since is not None and r.served != r.unready_served:
                    # It answered predicts meanwhile: slow, not stuck. Not replaced yet; the probe re-admits it.
                    r.unready_since, r.unready_served = now, r.served
                elif not r.draining and r.unready_since is not None \
                        and now - r.unready_since >= self.readiness.replace_after_s:
                    log.warning("replica %s of deployed model %s stayed unready for %.0f s; stopping and replacing "
                                "it", r.id, d.id, now - r.unready_since)
                    r.draining = True  # no longer counted: its replacement starts on this tick
                    self._spawn(self._replace_stuck(r))
            want = self.autoscaler.desired(d) if self.autoscaler else d.min_replicas
            want = max(d.min_replicas, min(d.max_replicas, want))
            have = len(d.live()) + self._starting.get(d.id, 0)
            if have < want and time.monotonic() - self._failed_at.get(d.id, -1e9) > RETRY_AFTER_FAILURE_S:
                self._spawn(self._grow(d, want - have))
            elif have > want and not self._starting.get(d.id):
                live = d.live()
                victim = min(live, key=lambda r: r.outstanding)
                log.info("scaling deployed model %s down to %d replica(s)", d.id, want)
                self._spawn(self.retire(victim))

    async def _grow(self, d: Deployed, count: int) -> None:
        self._starting[d.id] = self._starting.get(d.id, 0) + count
        try:
            model_id = d.model.rsplit("/", 1)[-1]
            path = Path(self.store.get_version(model_id, d.version_id)["local_path"])
            log.info("starting %d replica(s) of deployed model %s", count, d.id)
            for row in await self.start_replicas(d.id, path, count, use_spare=True):
                added = self.routing.add_replica(d.id, row)
                self.started(row)
                if added is None:  # undeployed meanwhile
                    await self.discard(row)
        except Exception as exc:
            self._failed_at[d.id] = time.monotonic()
            log.error("could not start replicas of deployed model %s: %s", d.id, getattr(exc, "message", exc))
        finally:
            self._starting[d.id] -= count

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
