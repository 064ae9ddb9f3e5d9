"""The gateway's in-memory view of where requests go: endpoints, their split, deployed models and
their live replicas with in-flight counts.

Read whole from the store once (``Routing.load``'s first call: two queries, whatever the number of
endpoints). After that a change this platform makes to one endpoint (created, patched, deleted, a model
deployed or undeployed) re-reads that endpoint alone (``Routing.load_endpoint``), and the once-a-second
sync that picks up other platforms' changes (``Routing.load`` again) reads only the ids and update times
of endpoints changed in the last ``SKEW_S`` seconds, then the rows of those that differ from what it
routes; it reads everything again only when the number of endpoints says one vanished. So neither a
control-plane call nor the sync grows with the number of endpoints (3 or 3,000), and predicts on the
same event loop are not held up by it. Replica objects and their counters are kept throughout.
All choices happen without awaiting, so a request's deployed model and replica are picked (and
its in-flight count taken) atomically with respect to splits changing and replicas draining.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from modelyard.platform.api import names
from modelyard.platform.api.errors import ApiError, not_found
from modelyard.platform.dataplane import replica_secrets
from modelyard.platform.dataplane.pool_home import home_of, home_order
from modelyard.platform.dataplane.traffic import Chooser
from modelyard.platform.dataplane.upstream import Upstream


MODEL = "model"  # the name every replica of its own serves its one model under (replicas.py starts it so)


@dataclass(eq=False)
class Replica:
    row: dict
    outstanding: int = 0
    draining: bool = False
    dead: bool = False
    served: int = 0
    upstream: Upstream | None = None
    # Since when the replica misses its readiness deadline (None: ready). An unready replica gets no new
    # request; the supervisor re-admits it when it answers again, or replaces it if it stays stuck.
    unready_since: float | None = None
    unready_served: int = 0  # ``served`` when it was found unready: an answer since then shows it is not stuck
    probing: bool = False

    PREDICT_PATH = f"/v1/models/{MODEL}:predict".encode()

    @property
    def id(self) -> str:
        return self.row["id"]

    @property
    def state(self) -> str:
        """What an operator is shown: DEAD, DRAINING, UNREADY (missing its readiness deadline: it gets
        no new request) or SERVING."""
        return ("DEAD" if self.dead else "DRAINING" if self.draining
                else "UNREADY" if self.unready_since is not None else "SERVING")

    def connections(self) -> Upstream:
        if self.upstream is None:
            self.upstream = Upstream(self.row["host"], self.row["port"], replica_secrets.authorization(self.row))
        return self.upstream


def predict_path(dm_id: str) -> bytes:
    """Where a pool replica answers one deployed model's predicts: it serves each model under its id."""
    return f"/v1/models/{dm_id}:predict".encode()


@dataclass(eq=False)
class Deployed:
    id: str
    endpoint_id: str
    model: str  # full resource name of the model
    version_id: str
    display_name: str
    min_replicas: int
    max_replicas: int
    shadow_percent: int = 0
    replicas: list[Replica] = field(default_factory=list)
    # A deployment resource pool's model: its replicas are the pool's (the same list, Routing.pools), where it
    # is served under its own id; ``home`` spreads the pool's models over those replicas (choose_replica).
    pool_id: str | None = None
    predict_path: bytes = Replica.PREDICT_PATH
    v2_infer_path: bytes = f"/v2/models/{MODEL}/infer".encode()  # a replica of its own serves its model as MODEL
    v2_model_path: bytes = f"/v2/models/{MODEL}".encode()
    home: int = 0

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if not r.draining and not r.dead]

    def in_flight(self) -> int:
        return sum(r.outstanding for r in self.replicas)


@dataclass(eq=False)
class EndpointRoute:
    id: str
    parent: str
    chooser: Chooser
    deployed: dict[str, Deployed]
    shadows: list[Deployed] = field(default_factory=list)
    updated: float = 0.0  # the row's update time: a sync skips an endpoint whose row has not changed
    rows: tuple = ()  # (endpoint row, deployed model rows) it was made from: what the data plane's mirror is sent


# A sync re-reads the endpoints changed this long before the last one: a change committed a little after
# the time it wrote (a slow commit), or written by a platform whose clock is a little behind, is not missed.
SKEW_S = 5.0


class Routing:
    def __init__(self) -> None:
        self.endpoints: dict[str, EndpointRoute] = {}
        self.deployed: dict[str, Deployed] = {}
        self.pools: dict[str, list[Replica]] = {}  # pool id -> its replicas (dataplane/pools.py keeps them)
        self._synced_at: float | None = None  # when the last load began (None: never loaded)
        # With a data-plane process (dataplane/mirror.py): the endpoints changed since it was last sent them
        # (FULL: all of them); None: nobody follows this routing.
        self.journal: set[str] | None = None

    FULL = "*"

    def load(self, store) -> None:
        """Follow the store: the whole of it the first time (or when an endpoint vanished), else only the
        endpoints changed since the last call (see the module's docstring)."""
        started = time.time()
        if self._synced_at is None:
            self._load_all(store)
        else:
            changed, count = store.endpoints_changed_since(self._synced_at - SKEW_S)
            stale = [ep_id for ep_id, updated in changed
                     if ep_id not in self.endpoints or self.endpoints[ep_id].updated != updated]
            if stale:
                rows, dms = store.endpoints_with_deployed(stale)
                by_endpoint: dict[str, list[dict]] = {}
                for dm in dms:
                    by_endpoint.setdefault(dm["endpoint_id"], []).append(dm)
                for ep in rows:
                    self.put_endpoint(ep, by_endpoint.get(ep["id"], []))
            if count != len(self.endpoints):  # one was deleted elsewhere (or appeared out of the window)
                self._load_all(store)
        self._synced_at = started

    def _load_all(self, store) -> None:
        """Rebuild from the store; replica objects (and their counters) of surviving models are kept."""
        self.load_rows(store.list_endpoints(), store.deployed_models())

    def load_rows(self, endpoint_rows: list[dict], dm_rows: list[dict]) -> None:
        """Route exactly these endpoints (store rows) and deployed models, whatever was routed before;
        replica objects of surviving models are kept."""
        old = self.deployed
        deployed: dict[str, Deployed] = {}
        endpoints: dict[str, EndpointRoute] = {}
        by_endpoint: dict[str, list[dict]] = {}
        for dm in dm_rows:
            by_endpoint.setdefault(dm["endpoint_id"], []).append(dm)
        for ep in endpoint_rows:
            route = self._route(ep, by_endpoint.get(ep["id"], []), old, self.endpoints.get(ep["id"]))
            self._join_pools(route)
            endpoints[ep["id"]] = route
            deployed.update(route.deployed)
        self.deployed, self.endpoints = deployed, endpoints
        if self.journal is not None:
            self.journal.add(self.FULL)

    @staticmethod
    def _route(ep: dict, dms: list[dict], old: dict[str, Deployed], before: EndpointRoute | None = None
               ) -> EndpointRoute:
        if before is not None and before.updated == ep["updated"] and set(before.deployed) == {d["id"] for d in dms}:
            return before  # unchanged: kept as it is (its chooser too)
        members = {}
        for dm in dms:
            d = old.get(dm["id"]) or Deployed(
                dm["id"], ep["id"], names.model_name(ep["parent"], dm["model_id"]), dm["version_id"],
                dm["display_name"], dm["min_replicas"], dm["max_replicas"])
            d.min_replicas, d.max_replicas = dm["min_replicas"], dm["max_replicas"]
            d.shadow_percent = dm["shadow_percent"] or 0
            d.pool_id = dm.get("pool_id")
            members[dm["id"]] = d
        return EndpointRoute(ep["id"], ep["parent"], Chooser(ep["traffic_split"] or {}), members,
                             [d for d in members.values() if d.shadow_percent > 0], ep["updated"], (ep, dms))

    def load_endpoint(self, store, endpoint_id: str) -> None:
        """Follow a change to one endpoint: it and its deployed models are read again (gone: dropped)."""
        ep, dms = store.endpoint_with_deployed(endpoint_id)
        self.put_endpoint(ep, dms, endpoint_id)

    def put_endpoint(self, ep: dict | None, dms: list[dict], endpoint_id: str | None = None) -> None:
        """Route ``ep`` (a store row) with its deployed models ``dms`` (rows); ``ep`` None: the endpoint
        ``endpoint_id`` is gone. Only this endpoint's entries change, replaced whole (never half-updated
        for a request: nothing here awaits)."""
        endpoint_id = endpoint_id or ep["id"]
        if self.journal is not None:
            self.journal.add(endpoint_id)
        before = self.endpoints.get(endpoint_id)
        route = self._route(ep, dms, self.deployed, before) if ep is not None else None
        if route is not None:
            self._join_pools(route)
        if before is not None:
            for dm_id in before.deployed:
                if route is None or dm_id not in route.deployed:
                    self.deployed.pop(dm_id, None)
        if route is None:
            self.endpoints.pop(endpoint_id, None)
            return
        self.deployed.update(route.deployed)
        self.endpoints[endpoint_id] = route

    def _join_pools(self, route: EndpointRoute) -> None:
        """A pool's deployed models route over the pool's replicas (one list, shared), by their own path."""
        for d in route.deployed.values():
            if d.pool_id and d.replicas is not self.pools.get(d.pool_id):
                d.replicas = self.pools.setdefault(d.pool_id, [])
                d.predict_path = predict_path(d.id)
                d.v2_infer_path, d.v2_model_path = f"/v2/models/{d.id}/infer".encode(), f"/v2/models/{d.id}".encode()
                d.home = home_of(d.id)

    def add_replica(self, dm_id: str, row: dict) -> Replica | None:
        d = self.deployed.get(dm_id)
        if d is None:
            return None
        replica = Replica(row)
        d.replicas.append(replica)
        return replica

    def remove_replica(self, replica: Replica) -> None:
        for d in self.deployed.values():
            if replica in d.replicas:
                d.replicas.remove(replica)
        if replica.upstream is not None:
            replica.upstream.close()

    def choose_deployed(self, endpoint_id: str, parent: str, pinned: str | None) -> tuple[Deployed, list[Deployed]]:
        """The deployed model that answers, and the shadows the request is also mirrored to."""
        ep = self.endpoints.get(endpoint_id)
        if ep is None or ep.parent != parent:
            raise not_found("Endpoint", endpoint_id)
        if pinned:
            d = ep.deployed.get(pinned)
            if d is None:
                raise ApiError("NOT_FOUND", f"Deployed model {pinned} is not deployed on endpoint {endpoint_id}.")
            return d, []  # a pinned request is a test of one model: not mirrored
        chosen = ep.chooser.choose()
        if chosen is None:
            raise ApiError("FAILED_PRECONDITION",
                           f"Endpoint {endpoint_id} has no deployed model with traffic: deploy a model first.")
        d = ep.deployed[chosen]
        if not ep.shadows:
            return d, []
        return d, [s for s in ep.shadows if s is not d and ep.chooser.coin(s.shadow_percent)]

    def v2_deployed(self, name: str, endpoint_id: str | None, parent: str | None) -> Deployed:
        """The deployed model a V2 call's ``/v2/models/{name}`` names. At the platform's root, ``name`` is
        an endpoint id (its split chooses) or a deployed model id; under an endpoint, that endpoint's id
        (its split) or one of its deployed model ids (pinned, as the pinning header does)."""
        if endpoint_id is not None:
            return self.choose_deployed(endpoint_id, parent, None if name == endpoint_id else name)[0]
        ep = self.endpoints.get(name)
        if ep is not None:
            return self.choose_deployed(name, ep.parent, None)[0]
        d = self.deployed.get(name)
        if d is None:
            raise ApiError("NOT_FOUND", f"model '{name}' is neither an endpoint id nor a deployed model id")
        return d

    @staticmethod
    def choose_replica(d: Deployed, exclude: set[int] | None = None) -> Replica | None:
        """The live, ready replica with the fewest in-flight requests (ties: the first). When every live
        replica is unready (an overloaded host can make a slow one look stuck), the least busy of them:
        the gateway's deadline still bounds the wait, and refusing would fail every request."""
        best = fallback = None
        replicas = d.replicas
        if d.home and len(replicas) > 1:  # a pool's model starts at its own replica: models spread, hot ones spill
            replicas = home_order(d.home, replicas)
        for r in replicas:
            if r.draining or r.dead or (exclude and id(r) in exclude):
                continue
            if r.unready_since is not None:
                if fallback is None or r.outstanding < fallback.outstanding:
                    fallback = r
            elif best is None or r.outstanding < best.outstanding:
                best = r
        return best or fallback
