"""The manager's version rules, with an in-process fake loader (no TensorFlow): fast and exact."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from modelyard.errors import Code, ServingError
from modelyard.serving.manager.manager import AVAILABLE, END, Manager, ModelConfig
from modelyard.model.runtime.servable import Servable
from modelyard.serving.manager.versions import VersionPolicy, version_dirs


class FakeServable(Servable):
    runtime = "fake"

    def __init__(self, path):
        super().__init__(path, {}, {})
        self.closed = False

    def run(self, signature, inputs, output_aliases):
        return {}

    def close(self):
        self.closed = True


def make_loader(fail: set[int] = frozenset(), gate: threading.Event | None = None):
    def load(name, version, path: Path):
        if gate is not None:
            gate.wait(10)
        if (path / "broken").exists() or version in fail:
            raise ServingError(Code.DATA_LOSS, f"cannot load {path}")
        return FakeServable(path)

    return load


def state_of(manager, name):
    return {r.version: r.state for r in manager.version_states(name)}


def test_version_dirs_ignore_non_integer_names(tmp_path):
    for name in ("0001", "2", ".tmp-0003-x", "notes", "10"):
        (tmp_path / name).mkdir()
    (tmp_path / "7").write_text("a file, not a version")
    assert sorted(version_dirs(tmp_path)) == [1, 2, 10]


@pytest.mark.parametrize(
    "policy,expected",
    [(VersionPolicy(), {5}), (VersionPolicy("latest", 2), {3, 5}), (VersionPolicy("all"), {1, 3, 5}),
     (VersionPolicy("specific", versions=frozenset({1, 4})), {1})],
)
def test_version_policies(policy, expected):
    assert policy.aspired({1, 3, 5}) == expected


def test_failed_new_version_keeps_old_serving_and_retries_when_files_change(tmp_path):
    (tmp_path / "1").mkdir()
    manager = Manager(make_loader())
    manager.set_models([ModelConfig("m", tmp_path)])
    assert manager.wait_settled(timeout=10)
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "broken").write_text("x")
    manager.poll()
    assert manager.wait_settled(timeout=10)
    assert state_of(manager, "m") == {2: END, 1: AVAILABLE}
    assert manager.version_states("m")[0].error.code == Code.DATA_LOSS
    with manager.acquire("m") as handle:
        assert handle.version == 1
    manager.poll()  # unchanged files: no retry
    assert manager.wait_settled(timeout=10)
    assert state_of(manager, "m")[2] == END
    (tmp_path / "2" / "broken").unlink()
    (tmp_path / "2" / "fixed").write_text("y")
    manager.poll()
    assert manager.wait_settled(timeout=10)
    manager.poll()
    assert manager.wait_settled(timeout=10)
    assert state_of(manager, "m") == {2: AVAILABLE, 1: END}


def test_new_version_available_before_old_unloads(tmp_path):
    (tmp_path / "1").mkdir()
    gate = threading.Event()
    gate.set()
    manager = Manager(make_loader(gate=gate))
    manager.set_models([ModelConfig("m", tmp_path)])
    manager.wait_settled(timeout=10)
    gate.clear()
    (tmp_path / "2").mkdir()
    manager.poll()
    # version 2 is loading: version 1 still serves
    with manager.acquire("m") as handle:
        assert handle.version == 1
    gate.set()
    manager.wait_settled(timeout=10)
    with manager.acquire("m") as handle:
        assert handle.version == 2


def test_unload_waits_for_inflight_requests(tmp_path):
    (tmp_path / "1").mkdir()
    manager = Manager(make_loader(), unload_timeout_s=10)
    manager.set_models([ModelConfig("m", tmp_path)])
    manager.wait_settled(timeout=10)
    handle = manager.acquire("m")
    servable = handle.servable
    manager.set_models([])  # remove the model while a request holds it
    assert not manager.wait_settled(timeout=0.5)
    assert not servable.closed
    handle.__exit__(None, None, None)
    assert manager.wait_settled(timeout=10)
    assert servable.closed


def test_lookup_errors(tmp_path):
    (tmp_path / "3").mkdir()
    manager = Manager(make_loader())
    manager.set_models([ModelConfig("m", tmp_path, labels={"stable": 3})])
    manager.wait_settled(timeout=10)
    with manager.acquire("m", label="stable") as handle:
        assert handle.version == 3
    with pytest.raises(ServingError, match=r"Servable not found for request: Specific\(m, 4\)"):
        manager.acquire("m", version=4)
    with pytest.raises(ServingError, match="Unrecognized servable version label: beta"):
        manager.acquire("m", label="beta")
    with pytest.raises(ServingError, match="multiple times"):
        manager.set_models([ModelConfig("a", tmp_path), ModelConfig("a", tmp_path)])
