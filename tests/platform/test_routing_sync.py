"""Issue 43, finding 13: routing follows the store at a cost that does not grow with the number of
endpoints. One layer down, no process: a Routing over a SQLite store written directly.

The first load reads everything; a later sync (each platform runs one a second) reads every endpoint's
row only when one vanished, else just the endpoints changed lately; one endpoint's change re-reads it
alone. Before, every create reloaded every endpoint and every sync read them all.
"""
from __future__ import annotations

import time

import pytest

from modelyard.platform.dataplane import mirror
from modelyard.platform.dataplane.routing import Deployed, Replica, Routing
from modelyard.platform.state.store import Store
from tests.platform.conftest import PARENT


class CountingStore:
    """The store, counting the whole-table reads routing makes."""

    def __init__(self, store: Store) -> None:
        self.store, self.full_reads = store, 0

    def list_endpoints(self, *args, **kwargs):
        self.full_reads += 1
        return self.store.list_endpoints(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def _endpoint(store: Store, i: int, updated: float | None = None) -> str:
    now = updated or time.time()
    store.add_endpoint({"id": str(10**17 + i), "parent": PARENT, "display_name": f"e{i}", "description": "",
                        "labels": {}, "traffic_split": {}, "created": now, "updated": now})
    return str(10**17 + i)


@pytest.fixture
def store(tmp_path):
    st = CountingStore(Store(f"sqlite:///{tmp_path / 'platform.db'}"))
    yield st
    st.store.close()


def test_sync_reads_only_what_changed(store):
    old = time.time() - 3600
    ids = [_endpoint(store.store, i, updated=old) for i in range(300)]
    routing = Routing()
    routing.load(store)
    assert store.full_reads == 1 and set(routing.endpoints) == set(ids)
    kept = routing.endpoints[ids[0]]
    for _ in range(3):  # nothing changed: nothing read whole, nothing rebuilt
        routing.load(store)
    assert store.full_reads == 1 and routing.endpoints[ids[0]] is kept
    new = _endpoint(store.store, 1000)  # another platform creates one, and patches one
    store.store.update_endpoint(ids[5], {"display_name": "renamed", "traffic_split": {}})
    routing.load(store)
    assert store.full_reads == 1 and new in routing.endpoints and routing.endpoints[ids[0]] is kept
    assert routing.endpoints[ids[5]].updated > old
    store.store.delete_endpoint(ids[7])  # another platform deletes one: the count shows it
    routing.load(store)
    assert store.full_reads == 2 and ids[7] not in routing.endpoints and len(routing.endpoints) == 300


def test_one_endpoint_followed_alone(store):
    ids = [_endpoint(store.store, i) for i in range(50)]
    routing = Routing()
    routing.load(store)
    routing.load_endpoint(store, ids[3])
    store.store.delete_endpoint(ids[4])
    routing.load_endpoint(store, ids[4])
    assert ids[4] not in routing.endpoints and len(routing.endpoints) == 49 and store.full_reads == 1


# ---- the data-plane process's mirror (dataplane/mirror.py), one layer down: no process, no socket -------------
def _deploy(store: Store, endpoint_id: str, dm_id: str, pool_id: str | None = None) -> None:
    store.add_deployed_model({"id": dm_id, "endpoint_id": endpoint_id, "model_id": "7", "version_id": "1",
                              "display_name": "m", "min_replicas": 1, "max_replicas": 2, "machine_type": "",
                              "created": time.time(), "shadow_percent": 0, "pool_id": pool_id}, {dm_id: 100})


def _sent(control: Routing) -> dict:
    """What the control plane sends after a change (split.py's flush), through the wire's own framing."""
    import asyncio

    msg = {"seq": 1, **mirror.endpoint_changes(control, control.journal), "replicas": mirror.replica_view(control)}
    control.journal = set()

    async def through_the_wire() -> dict:
        reader = asyncio.StreamReader()
        reader.feed_data(mirror.frame(msg))
        return await mirror.read_message(reader)

    return asyncio.run(through_the_wire())


def _routes(routing: Routing) -> dict:
    return {ep_id: (r.parent, r.chooser.ids, sorted(r.deployed), [(x.id, x.draining, x.dead, x.unready_since is not None)
                                                              for d in r.deployed.values() for x in d.replicas])
            for ep_id, r in routing.endpoints.items()}


def test_the_data_plane_mirrors_the_control_planes_routing_change_by_change(store):
    ids = [_endpoint(store.store, i) for i in range(20)]
    _deploy(store.store, ids[0], "500")
    control = Routing()
    control.journal = set()
    control.load(store)
    control.add_replica("500", {"id": "900", "host": "127.0.0.1", "port": 1})
    plane = mirror.Mirror(Routing())
    plane.apply(_sent(control))  # the first message: everything
    assert _routes(plane.routing) == _routes(control) and len(plane.routing.endpoints) == 20

    store.store.update_endpoint(ids[3], {"display_name": "renamed", "traffic_split": {}})
    control.load_endpoint(store, ids[3])
    store.store.delete_endpoint(ids[4])
    control.load_endpoint(store, ids[4])
    new = _endpoint(store.store, 99)
    control.load_endpoint(store, new)
    sent = _sent(control)
    assert "full" not in sent and sorted(e for _, _, e in sent["put"]) == sorted([ids[3], ids[4], new])
    kept = plane.routing.endpoints[ids[5]]
    plane.apply(sent)
    assert _routes(plane.routing) == _routes(control) and plane.routing.endpoints[ids[5]] is kept

    replica = control.deployed["500"].replicas[0]
    replica.draining = True  # the supervisor retires it; then it is gone
    plane.apply(_sent(control))
    assert _routes(plane.routing) == _routes(control) and plane.routing.deployed["500"].replicas[0].draining
    control.remove_replica(replica)
    plane.apply(_sent(control))
    assert plane.routing.deployed["500"].replicas == [] and plane.replicas == {}


def test_a_pools_replicas_stay_one_list_in_the_mirror(store):
    ep = _endpoint(store.store, 1)
    _deploy(store.store, ep, "501", pool_id="77")
    control = Routing()
    control.journal = set()
    control.load(store)
    control.pools["77"].append(Replica({"id": "901", "host": "127.0.0.1", "port": 2}))
    plane = mirror.Mirror(Routing())
    plane.apply(_sent(control))
    shared = plane.routing.pools["77"]
    assert plane.routing.deployed["501"].replicas is shared and [r.id for r in shared] == ["901"]
    control.pools["77"][0].unready_since = 1.0
    plane.apply(_sent(control))
    assert plane.routing.pools["77"] is shared and shared[0].unready_since is not None


def test_a_drain_waits_until_the_data_plane_knows_the_replica_is_draining():
    """The control plane's count of a draining replica stays non-zero until the data plane acknowledged
    the message that made it draining: a report sent before that says nothing about new requests."""
    control = Routing()
    d = control.deployed["500"] = Deployed("500", "1", "m", "1", "m", 1, 1)
    r = Replica({"id": "900", "host": "h", "port": 1})
    d.replicas.append(r)
    counts = mirror.Counts()
    counts.apply(control, acked=1, counts={"900": [3, 10]})
    assert (r.outstanding, r.served) == (3, 10)
    r.draining = True
    counts.apply(control, acked=1, counts={"900": [0, 13]})  # not sent yet
    assert r.outstanding == 1 and r.served == 13
    counts.sent(2, mirror.replica_view(control))
    counts.apply(control, acked=1, counts={"900": [0, 13]})  # sent, not yet applied there
    assert r.outstanding == 1
    counts.apply(control, acked=2, counts={"900": [2, 13]})  # applied: its own requests still in flight
    assert r.outstanding == 2
    counts.apply(control, acked=2, counts={"900": [0, 15]})
    assert r.outstanding == 0
    r.outstanding = 4
    counts.lost(control)  # the data plane died: nothing is in flight through it
    assert r.outstanding == 0
