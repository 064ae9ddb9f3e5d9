"""Issue 43, finding 13: routing follows the store at a cost that does not grow with the number of
endpoints. One layer down, no process: a Routing over a SQLite store written directly.

The first load reads everything; a later sync (each platform runs one a second) reads every endpoint's
row only when one vanished, else just the endpoints changed lately; one endpoint's change re-reads it
alone. Before, every create reloaded every endpoint and every sync read them all.
"""
from __future__ import annotations

import time

import pytest

from modelyard.platform.dataplane.routing import Routing
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
