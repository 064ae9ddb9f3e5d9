"""Models loaded on demand under a budget (serving/manager/on_demand.py), with the manager's fake loader:
first request loads, least recently used unloads, a model in use is never unloaded, concurrent first
requests share one load, a model larger than the budget is refused, the event loop never waits."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from modelyard.errors import Code, ServingError
from modelyard.model.footprint import footprint_bytes
from modelyard.serving.manager.config_changes import ChangesFile, net_changes
from modelyard.serving.manager.manager import Manager, ModelConfig
from modelyard.serving.manager.on_demand import OnDemand
from tests import aio
from tests.serving.test_manager import FakeServable

SIZE = 1000  # each model's file bytes


def _models(tmp_path, count: int, size: int = SIZE) -> list[ModelConfig]:
    configs = []
    for i in range(count):
        version = tmp_path / f"m{i}" / "1"
        version.mkdir(parents=True)
        (version / "weights").write_bytes(b"\0" * size)
        configs.append(ModelConfig(f"m{i}", tmp_path / f"m{i}"))
    return configs


class CountingLoader:
    def __init__(self, gate: threading.Event | None = None) -> None:
        self.loads: list[str] = []
        self.gate = gate
        self.lock = threading.Lock()

    def __call__(self, name, version, path):
        with self.lock:
            self.loads.append(name)
        if self.gate is not None:
            assert self.gate.wait(10)
        if (path / "broken").exists():
            raise ServingError(Code.DATA_LOSS, f"cannot load {path}")
        return FakeServable(path)


def _manager(tmp_path, count: int, budget: int, loader=None, measure=lambda: 0) -> tuple[Manager, OnDemand,
                                                                                        CountingLoader]:
    loader = loader or CountingLoader()
    on_demand = OnDemand(budget, measure=measure)  # by default loads cost no memory: weights are file bytes
    manager = Manager(loader, on_demand=on_demand)
    manager.set_models(_models(tmp_path, count))
    return manager, on_demand, loader


def _use(manager, name: str) -> None:
    with manager.acquire(name) as handle:
        assert handle.version == 1


def test_nothing_loads_before_its_first_request_then_the_least_recently_used_unloads(tmp_path):
    manager, on_demand, loader = _manager(tmp_path, 5, budget=3 * SIZE)
    assert loader.loads == [] and manager.resident_models() == []
    for name in ("m0", "m1", "m2", "m0", "m3"):  # m1 is the least recently used when m3 needs room
        _use(manager, name)
    assert loader.loads == ["m0", "m1", "m2", "m3"]
    assert sorted(n for n, _, loaded in manager.resident_models() if loaded) == ["m0", "m2", "m3"]
    state = on_demand.state()
    assert state["models"]["m1"] == {**state["models"]["m1"], "loaded": False, "loads": 1, "unloads": 1}
    for name in ("m4", "m1", "m2", "m0"):
        _use(manager, name)
    assert on_demand.peak_resident == 3 and on_demand.resident_bytes() <= 3 * SIZE
    assert state["budget_bytes"] == 3 * SIZE


def test_a_model_held_by_a_request_is_never_unloaded(tmp_path):
    manager, on_demand, loader = _manager(tmp_path, 3, budget=2 * SIZE)
    _use(manager, "m1")
    held = manager.acquire("m0")  # m0 is now the most recent; m1 would be next, but make m1 held too
    held_too = manager.acquire("m1")
    done = threading.Event()

    def third():
        _use(manager, "m2")  # no room until one of them is released
        done.set()

    thread = threading.Thread(target=third)
    thread.start()
    assert not done.wait(0.3)
    assert not held.record.servable.closed and not held_too.record.servable.closed
    held_too.__exit__(None, None, None)  # m1 free: it goes, m0 (held) stays
    assert done.wait(5)
    thread.join()
    assert held.record.servable is not None and not held.record.servable.closed
    held.__exit__(None, None, None)
    assert sorted(n for n, _, loaded in manager.resident_models() if loaded) == ["m0", "m2"]


def test_concurrent_first_requests_share_one_load(tmp_path):
    gate = threading.Event()
    manager, _, loader = _manager(tmp_path, 2, budget=0, loader=CountingLoader(gate))
    with ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(_use, manager, "m1") for _ in range(10)]
        while not loader.loads:
            threading.Event().wait(0.01)
        gate.set()
        for f in futures:
            f.result(timeout=10)
    assert loader.loads == ["m1"]


def test_a_model_larger_than_the_budget_is_refused(tmp_path):
    manager, _, loader = _manager(tmp_path, 1, budget=SIZE // 2)
    with pytest.raises(ServingError) as err:
        manager.acquire("m0")
    assert err.value.code == Code.RESOURCE_EXHAUSTED and "budget" in err.value.message and loader.loads == []


def test_the_event_loop_never_waits_for_a_load(tmp_path):
    manager, _, loader = _manager(tmp_path, 1, budget=0)

    async def on_loop():
        with pytest.raises(ServingError) as err:
            manager.acquire("m0")
        return err.value.code

    assert aio.run(on_loop()) == Code.UNAVAILABLE and loader.loads == []
    _use(manager, "m0")  # the thread pool loads it
    assert loader.loads == ["m0"]


def test_a_models_weight_is_its_files_bytes(tmp_path):
    (tmp_path / "variables").mkdir()
    (tmp_path / "saved_model.pb").write_bytes(b"x" * 10)
    (tmp_path / "variables" / "data").write_bytes(b"y" * 32)
    link = tmp_path.parent / f"{tmp_path.name}-link"
    link.symlink_to(tmp_path, target_is_directory=True)
    assert footprint_bytes(tmp_path) == footprint_bytes(link) == 42


def test_a_load_that_fails_answers_its_own_error(tmp_path):
    manager, _, _ = _manager(tmp_path, 1, budget=0)
    (tmp_path / "m0" / "1" / "broken").write_text("")  # the fake loader refuses it
    with pytest.raises(ServingError) as err:
        manager.acquire("m0")
    assert err.value.code == Code.DATA_LOSS and "cannot load" in err.value.message


def test_the_config_journal_is_read_from_where_it_stopped(tmp_path):
    journal = tmp_path / "models.changes"
    changes = ChangesFile(journal)
    assert changes.read() == []  # no journal yet
    journal.write_text('{"add": "a", "base_path": "/m/a"}\n{"add": "b", "base_')  # the second line half written
    assert changes.read() == [{"add": "a", "base_path": "/m/a"}]
    with open(journal, "a") as f:
        f.write('path": "/m/b"}\nnot json\n{"remove": "a"}\n')
    assert changes.read() == [{"add": "b", "base_path": "/m/b"}, {"remove": "a"}]  # the bad line skipped
    assert changes.read() == []
    tmp = tmp_path / "tmp"
    tmp.write_text("")
    tmp.replace(journal)  # folded into the config file by its writer: read from the start again
    with open(journal, "a") as f:
        f.write('{"remove": "b"}\n')
    assert changes.read() == [{"remove": "b"}]
    added, removed = net_changes([{"add": "a", "base_path": "/m/a"}, {"add": "b", "base_path": "/m/b"},
                                  {"remove": "a"}, {"remove": "c"}])
    assert [(c.name, str(c.base_path)) for c in added] == [("b", "/m/b")] and removed == ["a", "c"]


def test_a_change_to_the_models_leaves_the_others_loaded(tmp_path):
    manager, _, loader = _manager(tmp_path, 3, budget=0)
    _use(manager, "m0")
    _use(manager, "m1")
    (tmp_path / "new" / "1").mkdir(parents=True)
    manager.update_models([ModelConfig("new", tmp_path / "new")], ["m1"])
    _use(manager, "m0")  # still loaded: not loaded again
    _use(manager, "new")
    assert loader.loads == ["m0", "m1", "new"] and "m1" not in manager.model_names()
    with pytest.raises(ServingError) as err:
        manager.acquire("m1")
    assert err.value.code == Code.NOT_FOUND


def test_a_models_weight_is_what_its_load_was_measured_to_cost_when_more_than_its_files(tmp_path):
    """Each load alone adds its model's cost to the process's resident memory (a fake meter); the process's
    first load (the runtime starts with it) is not measured. Weights then are max(file bytes, measured)."""
    rss = [0]
    cost = {"m0": 500, "m1": 2500, "m2": 2500, "m3": 500}  # m1 and m2 hold more than their files (1000 bytes)

    class Metered(CountingLoader):
        def __call__(self, name, version, path):
            rss[0] += cost[name]
            return super().__call__(name, version, path)

    manager, on_demand, loader = _manager(tmp_path, 4, budget=4 * SIZE, loader=Metered(), measure=lambda: rss[0])
    _use(manager, "m0")  # the first load: not measured, weighs its files
    _use(manager, "m1")  # measured: 2500
    assert {n: m["bytes"] for n, m in on_demand.state()["models"].items()} == {"m0": 1000, "m1": 2500}
    assert on_demand.state()["models"]["m1"]["measured_bytes"] == 2500
    _use(manager, "m2")  # room for its files' 1000 (m0 goes), then measured 2500: over budget, so m1 goes too
    assert sorted(n for n, _, loaded in manager.resident_models() if loaded) == ["m2"]
    assert on_demand.resident_bytes() == 2500
    _use(manager, "m3")  # measured 500: weighs its files' 1000
    assert sorted(n for n, _, loaded in manager.resident_models() if loaded) == ["m2", "m3"]
    _use(manager, "m1")  # its measured weight is known before it loads: room for 2500 is made (m2 goes)
    assert sorted(n for n, _, loaded in manager.resident_models() if loaded) == ["m1", "m3"]
    assert on_demand.resident_bytes() == 3500 and on_demand.peak_resident_bytes <= 4000


def test_a_probe_since_its_last_seq_gets_only_the_models_resident_or_changed(tmp_path):
    manager, on_demand, _ = _manager(tmp_path, 5, budget=2 * SIZE)
    for name in ("m0", "m1", "m2"):  # m0 unloaded to make room for m2
        _use(manager, name)
    full = on_demand.state()
    assert set(full["models"]) == {"m0", "m1", "m2"}
    seq = full["seq"]
    assert set(on_demand.state(since=seq)["models"]) == {"m1", "m2"}  # nothing changed: the resident ones
    _use(manager, "m3")  # loads m3, unloads m1
    delta = on_demand.state(since=seq)
    assert set(delta["models"]) == {"m1", "m2", "m3"} and delta["seq"] > seq
    assert delta["models"]["m1"]["loaded"] is False and delta["models"]["m3"]["requests"] == 1


def test_the_on_demand_view_over_rest_and_its_bad_inputs(tmp_path):
    import json

    from modelyard.serving.core import ServingCore
    from modelyard.serving.metrics import ServingMetrics
    from modelyard.serving.protocol.rest import RestApp

    manager, on_demand, _ = _manager(tmp_path, 2, budget=0)
    _use(manager, "m0")
    app = RestApp(ServingCore(manager, ServingMetrics()), threads=1)
    try:
        status, body = app.handle("GET", "/v1/on_demand", b"")
        assert status == 200 and set(json.loads(body)["models"]) == {"m0"}
        status, body = app.handle("GET", f"/v1/on_demand?since={json.loads(body)['seq']}", b"")
        assert status == 200 and set(json.loads(body)["models"]) == {"m0"}  # resident
        status, body = app.handle("GET", "/v1/on_demand?since=x", b"")
        assert status == 400 and "since must be an integer" in json.loads(body)["error"]
        status, body = app.handle("GET", "/v1/on_demandx", b"")
        assert status == 400 and "Malformed request" in json.loads(body)["error"]
        manager.on_demand = None  # a server that loads every model at start
        status, body = app.handle("GET", "/v1/on_demand", b"")
        assert status == 400 and "does not load models on demand" in json.loads(body)["error"]
    finally:
        app.pool.shutdown()


def test_a_config_journal_needs_a_config_file_and_sits_beside_it(tmp_path):
    import argparse

    from modelyard.serving.options import OptionsError, add_flags, resolve

    parser = argparse.ArgumentParser()
    add_flags(parser)
    with pytest.raises(OptionsError, match="changes a --model_config_file"):
        resolve(parser.parse_args(["--model_config_changes_file", "j", "--model_name", "m",
                                   "--model_base_path", str(tmp_path)]))
    (tmp_path / "models.config").write_text("model_config_list {}\n")
    options = resolve(parser.parse_args(["--model_config_file", str(tmp_path / "models.config"),
                                         "--model_config_changes_file", "models.changes"]))
    assert options.model_config_changes_file == tmp_path.resolve() / "models.changes"



def _roots_check(tmp_path):
    """``root/a``, ``root/b`` and ``elsewhere`` (outside the root), each with a version; --model_roots' check of ``root``."""
    from modelyard.serving.security.paths import check_model_paths

    root = tmp_path / "root"
    for name in ("a", "b"):
        (root / name / "1").mkdir(parents=True)
    (tmp_path / "elsewhere" / "1").mkdir(parents=True)
    return root, lambda configs: check_model_paths(configs, (str(root.resolve()),))


def test_a_journal_model_outside_the_roots_is_skipped_and_the_others_apply(tmp_path):
    from modelyard.serving.manager.config_changes import admitted

    root, check = _roots_check(tmp_path)
    added, removed = net_changes([{"add": "far", "base_path": str(tmp_path / "elsewhere")},
                                  {"add": "b", "base_path": str(root / "b")}, {"remove": "a"}])
    kept = admitted(added, check)
    assert [c.name for c in kept] == ["b"] and removed == ["a"]


def test_a_journal_model_outside_the_roots_is_skipped_at_start_as_when_polled(tmp_path, caplog):
    """At start the whole journal is applied over the config file (``ModelServer.initial_configs`` ->
    ``over_config``): a line outside --model_roots is logged and skipped, as polling skips it (``admitted``),
    rather than refusing every model of the replica (FAILED_PRECONDITION stops a server at start)."""
    from modelyard.serving.manager.config_changes import over_config

    root, check = _roots_check(tmp_path)
    from_file = [ModelConfig("a", root / "a", labels={"stable": 1})]
    journal = [{"add": "far", "base_path": str(tmp_path / "elsewhere")}, {"add": "b", "base_path": str(root / "b")},
               {"add": "a", "base_path": str(root / "a")}]
    with caplog.at_level("ERROR", logger="modelyard.serving"):
        configs = over_config(from_file, journal, check)
    assert [(c.name, c.labels) for c in configs] == [("a", {"stable": 1}), ("b", {})]
    assert "model far not added" in caplog.text and "outside --model_roots" in caplog.text
    assert [c.name for c in over_config(from_file, journal)] == ["a", "far", "b"]  # no roots: every line
