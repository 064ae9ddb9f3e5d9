"""The data plane's copy of the control plane's routing, and the messages that keep it current.

The data-plane process (``dataplane/process.py``) answers predicts from a ``Routing`` of its own that
mirrors the control plane's: the control plane sends the store rows each changed endpoint was routed
from (``Routing.journal`` says which changed; ``Routing.put_endpoint``/``load_rows`` apply them on the
other side, the same code that follows the store), and a view of every replica with the state the
supervisor gave it (draining, dead, unready) and the secret it takes. The data plane answers with its
in-flight and served counts per replica, which the control plane's autoscaler, drains and readiness
probes read as they read the gateway's own counts before (``Counts``), and with its gateway metrics,
which ``/metrics`` and the console read from the control plane's ``Metrics`` as before.

The wire: 4-byte big-endian length, then an orjson object. Nothing here does I/O.
"""
from __future__ import annotations

import asyncio
import struct
import time
from collections import defaultdict

import orjson

from modelyard.platform.dataplane import replica_secrets
from modelyard.platform.dataplane.metrics import Metrics
from modelyard.platform.dataplane.routing import Replica, Routing
from modelyard.platform.dataplane.upstream import Upstream

_LENGTH = struct.Struct(">I")
MAX_MESSAGE = 1 << 30


def frame(msg: dict) -> bytes:
    # OPT_NON_STR_KEYS: a row's keys may be str subclasses (ids), which orjson refuses as keys otherwise.
    data = orjson.dumps(msg, default=str, option=orjson.OPT_NON_STR_KEYS)
    return _LENGTH.pack(len(data)) + data


async def read_message(reader: asyncio.StreamReader) -> dict:
    """The next message (``asyncio.IncompleteReadError`` at the end of the stream)."""
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if size > MAX_MESSAGE:
        raise ValueError(f"a link message of {size} bytes")
    return orjson.loads(await reader.readexactly(size))


# ---- the control plane's side: what the data plane is sent ----------------------------------------------
def endpoint_changes(routing: Routing, journal: set[str]) -> dict:
    """The message part that brings a mirror up to date with ``routing`` for the endpoints in ``journal``
    (``Routing.FULL`` in it: every endpoint, replacing the mirror's whole table)."""
    if Routing.FULL in journal:
        return {"full": [list(route.rows) for route in routing.endpoints.values()]}
    put = []
    for endpoint_id in journal:
        route = routing.endpoints.get(endpoint_id)
        put.append([route.rows[0], route.rows[1], endpoint_id] if route is not None else [None, [], endpoint_id])
    return {"put": put}


def _replica(r: Replica) -> list:
    auth = replica_secrets.authorization(r.row)
    return [r.id, r.row["host"], r.row["port"], auth.decode() if auth else None, r.draining, r.dead,
            r.unready_since is not None]


def replica_view(routing: Routing) -> dict:
    """Every routed replica, by deployed model (a pool's: by pool), with its state and secret."""
    return {"dm": {d.id: [_replica(r) for r in d.replicas] for d in routing.deployed.values()
                   if not d.pool_id and d.replicas},
            "pools": {pool_id: [_replica(r) for r in replicas] for pool_id, replicas in routing.pools.items()
                      if replicas}}


class Counts:
    """The control plane's side of the data plane's counts: each replica's in-flight and served requests
    as the data plane reports them. A replica the supervisor set draining counts as busy (at least one in
    flight) until the data plane has acknowledged a message that told it so: only then does its count say
    that no new request will reach it, so a drain that waits for zero waits for the data plane."""

    def __init__(self) -> None:
        self.draining_sent: dict[str, int] = {}  # replica id -> the message that first told the data plane

    def sent(self, seq: int, view: dict) -> None:
        for reps in (*view["dm"].values(), *view["pools"].values()):
            for rep in reps:
                if rep[4]:
                    self.draining_sent.setdefault(rep[0], seq)

    def apply(self, routing: Routing, acked: int, counts: dict[str, list[int]]) -> None:
        for r in _all_replicas(routing):
            got = counts.get(r.id)
            if got is None:
                continue
            outstanding, r.served = got
            if r.draining and self.draining_sent.get(r.id, acked + 1) > acked:
                outstanding = max(outstanding, 1)  # not yet known to the data plane as draining
            r.outstanding = outstanding
        live = {r.id for r in _all_replicas(routing)}
        for rid in [rid for rid in self.draining_sent if rid not in live]:
            del self.draining_sent[rid]

    def lost(self, routing: Routing) -> None:
        """The data plane is gone (its process ended): nothing is in flight through it any more."""
        for r in _all_replicas(routing):
            r.outstanding = 0
        self.draining_sent.clear()


def _all_replicas(routing: Routing):
    for d in routing.deployed.values():
        if not d.pool_id:
            yield from d.replicas
    for replicas in routing.pools.values():
        yield from replicas


def find_replica(routing: Routing, replica_id: str) -> Replica | None:
    return next((r for r in _all_replicas(routing) if r.id == replica_id), None)


# ---- the gateway's metrics, counted in the data plane, read in the control plane -------------------------
def metrics_state(metrics: Metrics) -> dict:
    """The data plane's gateway metrics as a message part (their tuple keys flattened)."""
    return {"requests": [[*key, n] for key, n in metrics.requests.items()],
            "latency": [[*key, h] for key, h in metrics.latency.items()],
            "shadow": [[*key, v] for key, v in metrics.shadow.items()]}


def metrics_stamp(metrics: Metrics) -> tuple[int, int]:
    """Changes whenever a metric does (requests answered, shadow requests mirrored)."""
    return sum(metrics.requests.values()), sum(v[0] for v in metrics.shadow.values())


def apply_metrics(metrics: Metrics, state: dict) -> None:
    """The control plane's ``Metrics`` (what ``/metrics`` and the console read) set to the data plane's."""
    metrics.requests = defaultdict(int, {(ep, dm, code): n for ep, dm, code, n in state["requests"]})
    metrics.latency = {(ep, dm): h for ep, dm, h in state["latency"]}
    metrics.shadow = {(ep, dm): v for ep, dm, v in state["shadow"]}


# ---- the data plane's side: applying what it is sent ------------------------------------------------------
class Mirror:
    """The data plane's routing, kept equal to the control plane's by the messages it is sent."""

    def __init__(self, routing: Routing) -> None:
        self.routing = routing
        self.replicas: dict[str, Replica] = {}
        self.view: dict = {"dm": {}, "pools": {}}

    def apply(self, msg: dict) -> None:
        routing = self.routing
        if "full" in msg:
            routing.load_rows([ep for ep, _ in msg["full"]], [dm for _, dms in msg["full"] for dm in dms])
        for ep, dms, endpoint_id in msg.get("put", ()):
            routing.put_endpoint(ep, dms, endpoint_id)
        if "replicas" in msg:
            self.view = msg["replicas"]
        self._place_replicas()

    def _place_replicas(self) -> None:
        """Every deployed model's (and pool's) replica list as the last view says, replica objects (and
        their counters) kept by id; replicas no longer listed are forgotten (a request still in flight to
        one finishes on its own reference)."""
        listed: set[str] = set()

        def objects(reps: list) -> list[Replica]:
            out = []
            for rid, host, port, auth, draining, dead, unready in reps:
                r = self.replicas.get(rid)
                if r is None or (r.row["host"], r.row["port"]) != (host, port):
                    r = self.replicas[rid] = Replica({"id": rid, "host": host, "port": port})
                    r.upstream = Upstream(host, port, auth.encode() if auth else None)
                r.draining, r.dead = draining, dead
                if not unready:
                    r.unready_since = None
                elif r.unready_since is None:
                    r.unready_since = time.monotonic()
                listed.add(rid)
                out.append(r)
            return out

        view = self.view
        for d in self.routing.deployed.values():
            if not d.pool_id:
                d.replicas = objects(view["dm"].get(d.id, []))
        for pool_id, reps in view["pools"].items():
            self.routing.pools.setdefault(pool_id, [])[:] = objects(reps)  # one list, shared by the pool's models
        for pool_id, replicas in self.routing.pools.items():
            if pool_id not in view["pools"]:
                replicas.clear()
        for rid in [rid for rid in self.replicas if rid not in listed]:
            gone = self.replicas.pop(rid)
            if gone.upstream is not None and not gone.outstanding:
                gone.upstream.close()

    def counts(self) -> dict[str, list[int]]:
        return {rid: [r.outstanding, r.served] for rid, r in self.replicas.items()}
