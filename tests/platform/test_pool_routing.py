"""How a pool's models route, one layer down (no process): every model of a pool routes over the pool's one
list of replicas, under its own path; each model starts at its own home replica, so idle models spread
over the pool, and a busy home sends the model to another replica (a hot model ends up on several)."""
from __future__ import annotations

import re
import time
import zlib

from modelyard.platform.dataplane.pool_home import home_of
from modelyard.platform.dataplane.routing import Replica, Routing
from tests import aio

PARENT = "projects/p/locations/l"


def _dm(dm_id: str, endpoint_id: str, pool_id: str | None) -> dict:
    return {"id": dm_id, "endpoint_id": endpoint_id, "model_id": "7", "version_id": "1", "display_name": dm_id,
            "min_replicas": 1, "max_replicas": 1, "shadow_percent": 0, "pool_id": pool_id}


def _endpoint(endpoint_id: str, dm_id: str) -> dict:
    return {"id": endpoint_id, "parent": PARENT, "traffic_split": {dm_id: 100}, "updated": time.time()}


def _routing(pooled: list[str]) -> Routing:
    routing = Routing()
    for i, dm_id in enumerate(pooled):
        routing.put_endpoint(_endpoint(f"{i + 1}", dm_id), [_dm(dm_id, f"{i + 1}", "pool-a")])
    routing.put_endpoint(_endpoint("99", "500"), [_dm("500", "99", None)])
    return routing


def test_a_pools_models_share_its_replicas_and_each_has_its_own_path():
    routing = _routing(["100", "101"])
    shared = routing.pools["pool-a"]
    shared += [Replica({"id": "r0", "host": "h", "port": 1}), Replica({"id": "r1", "host": "h", "port": 2})]
    a, b, own = routing.deployed["100"], routing.deployed["101"], routing.deployed["500"]
    assert a.replicas is shared and b.replicas is shared and own.replicas is not shared
    assert a.predict_path == b"/v1/models/100:predict" and own.predict_path == Replica.PREDICT_PATH
    routing.remove_replica(shared[0])  # gone for every model of the pool at once
    assert [r.id for r in a.replicas] == [r.id for r in b.replicas] == ["r1"]
    # A change to one endpoint (its row read again) keeps its model on the pool's list.
    routing.put_endpoint({**_endpoint("1", "100"), "updated": time.time() + 1}, [_dm("100", "1", "pool-a")])
    assert routing.deployed["100"].replicas is shared


def test_idle_models_spread_over_the_pool_and_a_busy_home_spills():
    routing = _routing([str(n) for n in range(100, 104)])
    shared = routing.pools["pool-a"]
    shared += [Replica({"id": f"r{i}", "host": "h", "port": i}) for i in range(2)]
    homes = {dm_id: Routing.choose_replica(routing.deployed[dm_id]).id for dm_id in ("100", "101", "102", "103")}
    assert homes == {"100": "r0", "101": "r1", "102": "r0", "103": "r1"}  # each model's own, spread evenly
    assert all(Routing.choose_replica(routing.deployed["100"]).id == "r0" for _ in range(5))  # stays put
    shared[0].outstanding = 1  # its home is busy: the next request of the hot model goes to the other
    assert Routing.choose_replica(routing.deployed["100"]).id == "r1"


def test_a_models_home_is_one_rule_the_same_in_every_process():
    # Routing (the gateway, in the data-plane process) and the pools' load-ahead (the control plane) count
    # homes with pool_home.home_of; a non-numeric id by CRC-32, not hash() (randomized per process).
    routing = _routing(["100", "model-x"])
    assert [routing.deployed[d].home for d in ("100", "model-x")] == [home_of("100"), home_of("model-x")]
    assert home_of("100") == 100 and home_of("model-x") == zlib.crc32(b"model-x") & 0xFFFF


def test_a_pool_scales_on_the_requests_in_flight_across_its_models(tmp_path):
    """The pool's replica count follows the autoscaler's rule on all its models' requests in flight, within
    min/max; dead replicas are replaced (the replica processes are stood in for: no process starts)."""
    import asyncio

    from modelyard.platform.dataplane.autoscale import Autoscaler, Policy
    from modelyard.platform.dataplane.pools import Pool, Pools

    class Counted(Pools):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.grown: list[int] = []
            self.retired: list[str] = []

        def alive(self, row: dict) -> bool:
            return row["id"] != "dead"

        async def grow(self, pool, count: int) -> None:
            self.grown.append(count)
            pool.replicas += [Replica({"id": f"new{len(pool.replicas) + i}", "host": "h", "port": 0})
                              for i in range(count)]

        async def retire(self, pool, replica, drain: bool = True) -> None:
            self.retired.append(replica.id)
            pool.replicas.remove(replica)

        async def _probe(self, pool, r) -> None:
            r.probing = False

    async def scenario() -> tuple[list[int], list[str]]:
        routing = _routing(["100"])
        pools = Counted(None, routing, tmp_path)
        clock = [0.0]
        pools.autoscaler = Autoscaler(Policy(target_in_flight=1.0, up_seconds=1.0, cooldown_seconds=2.0),
                                      clock=lambda: clock[0])
        pool = pools.pools["pool-a"] = Pool({"id": "pool-a", "min_replicas": 1, "max_replicas": 3},
                                            routing.pools["pool-a"])
        pool.replicas.append(Replica({"id": "r0", "host": "h", "port": 0}))
        pool.replicas[0].outstanding = 5  # five requests in flight on the pool's one replica: up to max (3)
        for step in range(8):
            clock[0] = step * 0.5
            await pools.tick()
            await asyncio.sleep(0)
        assert len(pool.live()) == 3 and pools.grown == [2]
        pool.replicas[0].outstanding = 0  # idle: back to min after the cooldown, one at a time
        for step in range(8, 40):
            clock[0] = step * 0.5
            await pools.tick()
            await asyncio.sleep(0)
        assert len(pool.live()) == 1
        pool.replicas[0].row["id"] = "dead"  # its process is gone: replaced
        await pools.tick()
        for _ in range(3):
            await asyncio.sleep(0)
        return pools.grown, pools.retired

    grown, retired = aio.run(scenario())
    assert grown == [2, 1] and len(retired) == 3


def test_a_model_is_hot_from_its_threshold_until_it_cools():
    from modelyard.platform.dataplane.load_ahead import HotModels, LoadAhead

    hot = HotModels(LoadAhead(hot_requests_per_s=10, cool_requests_per_s=2, window_s=5, copies=2, retell_s=10))
    hot.observe("r0", {"a": 1000}, now=0.0)  # a replica's first probe is its baseline: not a burst
    hot.observe("r1", {}, now=0.0)
    assert hot.update(0.0) == set()
    hot.observe("r0", {"a": 1020, "b": 5}, now=1.0)  # counters as the replicas' probes read them
    hot.observe("r1", {"a": 20}, now=1.0)
    assert hot.update(1.0) == set() and hot.rate("a", 1.0) == 8.0  # 40 requests over the 5 s window
    hot.observe("r0", {"a": 1035, "b": 5}, now=2.0)
    assert hot.update(2.0) == {"a"}  # 55 / 5 s
    assert hot.update(5.5) == {"a"}  # 11/s, then no request: still above the cool rate within the window
    hot.observe("r0", {"a": 3}, now=6.5)  # r0 restarted: its counter starts again (3 new requests, not -32)
    assert hot.rate("a", 6.5) == 3.6 and hot.update(6.5) == {"a"}
    assert hot.update(8.0) == set() and hot.rate("a", 8.0) == 0.6  # below 2/s: cooled
    assert hot.targets(7, ["r0", "r1", "r2"]) == ["r1", "r2"]  # its home (7 % 3), then the next one
    assert hot.targets(5, ["r0"]) == ["r0"]
    assert hot.should_tell("r1", "a", 9.0) and not hot.should_tell("r1", "a", 15.0) and hot.should_tell("r1", "a", 19.5)


def test_a_hot_model_is_loaded_ahead_on_the_replicas_that_lack_it(tmp_path):
    """Pools._load_ahead tells (by a line in the replica's journal) each target replica that the last probe
    saw without the hot model, once per retell period; an idle model is told nowhere."""
    import json

    from modelyard.platform.dataplane.load_ahead import HotModels, LoadAhead
    from modelyard.platform.dataplane.pools import CHANGES_FILE, Pool, Pools

    routing = _routing(["100", "101"])
    pools = Pools(None, routing, tmp_path)
    pool = Pool({"id": "pool-a", "min_replicas": 2, "max_replicas": 2}, routing.pools["pool-a"],
                hot=HotModels(LoadAhead(hot_requests_per_s=10, window_s=1)))
    pool.models = {"100": tmp_path, "101": tmp_path}
    for i in range(2):
        (tmp_path / f"r{i}").mkdir()
        pool.replicas.append(Replica({"id": f"r{i}", "host": "h", "port": i, "log_path": str(tmp_path / f"r{i}/log")}))
    pool.states = {"r0": {"models": {"100": {"loaded": True, "requests": 50}, "101": {"loaded": True, "requests": 1}}},
                   "r1": {"models": {}}}
    pool.hot.observe("r0", {}, now=9.0)
    pool.hot.observe("r0", {"100": 50, "101": 1}, now=10.0)
    pools._load_ahead(pool, 10.0)
    pools._load_ahead(pool, 10.5)  # told already: not again within retell_s
    lines = {rid: (tmp_path / rid / CHANGES_FILE).read_text().splitlines() if (tmp_path / rid / CHANGES_FILE).exists()
             else [] for rid in ("r0", "r1")}
    assert lines == {"r0": [], "r1": [json.dumps({"load": "100"})]}  # 100's home is r0 (100 % 2), loaded there


def test_a_pool_change_is_one_journal_line_until_the_journal_outgrows_the_config(tmp_path, monkeypatch):
    """write_config: the whole set at a replica's start; then a deploy or undeploy appends one line (the config
    file is not rewritten: O(1) in the pool's models), until the journal is longer than the config file."""
    import json

    from modelyard.platform.dataplane import pools as pools_module
    from modelyard.platform.dataplane.pools import CHANGES_FILE, CONFIG_FILE, write_config
    from modelyard.serving.manager.config_changes import net_changes

    monkeypatch.setattr(pools_module, "COMPACT_MIN_BYTES", 0)
    version = tmp_path / "v"
    version.mkdir()
    rdir = tmp_path / "r"
    rdir.mkdir()
    models = {str(i): version for i in range(20)}
    write_config(rdir, models)
    config = (rdir / CONFIG_FILE).read_text()
    assert config.count("config {") == 20 and (rdir / CHANGES_FILE).read_text() == ""
    models["20"] = version
    write_config(rdir, models, new=["20"])
    del models["3"]
    write_config(rdir, models, new=[], removed=["3"])
    assert (rdir / CONFIG_FILE).read_text() == config  # untouched
    assert [json.loads(line) for line in (rdir / CHANGES_FILE).read_text().splitlines()] == [
        {"add": "20", "base_path": str(rdir / "models" / "20")}, {"remove": "3"}]
    assert (rdir / "models" / "20" / "1").resolve() == version.resolve()
    for i in range(21, 60):  # the journal grows past the config file's size: folded into a new config
        models[str(i)] = version
        write_config(rdir, models, new=[str(i)])
    served = set(re.findall(r'name: "([^"]+)"', (rdir / CONFIG_FILE).read_text()))
    assert len(served) > 20 and len((rdir / CHANGES_FILE).read_text().splitlines()) < 39  # folded in at least once
    added, removed = net_changes([json.loads(line) for line in (rdir / CHANGES_FILE).read_text().splitlines()])
    assert (served | {c.name for c in added}) - set(removed) == set(models)  # config + journal: the pool's set


def test_a_replica_that_predates_the_journal_is_told_the_whole_config(tmp_path):
    """A replica adopted after an upgrade (its command line has no --model_config_changes_file) is told a
    change by a new config file, as before; one that reads the journal, or is not on this host, by a line."""
    import os

    from modelyard.platform.dataplane.pools import CHANGES_FILE, CONFIG_FILE, Pool, Pools, reads_journal

    assert not reads_journal({"pid": os.getpid()})  # this test's process: no such flag
    assert reads_journal({"pid": 2 ** 22 + 12345})  # no such process here
    routing = _routing(["100"])
    pools = Pools(None, routing, tmp_path)
    pool = Pool({"id": "pool-a", "min_replicas": 1, "max_replicas": 1}, routing.pools["pool-a"])
    (tmp_path / "r").mkdir()
    row = {"id": "r", "pid": os.getpid(), "log_path": str(tmp_path / "r" / "serve.log")}
    pool.models = {"100": tmp_path}
    pools._tell(row, pool)
    pool.models["101"] = tmp_path
    pools._tell(row, pool, new=["101"])
    assert 'name: "101"' in (tmp_path / "r" / CONFIG_FILE).read_text()
    assert (tmp_path / "r" / CHANGES_FILE).read_text() == ""
