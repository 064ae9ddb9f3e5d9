"""Must-show 3 and 4: a new version copied in under load, and a half-copied version directory.

One server for the file, polling its folders every second: each test changes the versions
of its own model (``swap``, ``half``, ``removed``), so they never see each other's.
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.serving.affine_models import save_affine
from tests.serving.server_process import ServerProcess, wait_for


class Model:
    """One model of the shared server: its base path, and its REST calls."""

    def __init__(self, server: ServerProcess, name: str, base: Path):
        self.server, self.name, self.base = server, name, base

    def predict(self, x=1.0):
        return requests.post(f"{self.server.base}/v1/models/{self.name}:predict",
                             data=json.dumps({"instances": [[x]]}), timeout=10)

    def states(self):
        r = requests.get(f"{self.server.base}/v1/models/{self.name}", timeout=10)
        return {int(s["version"]): s for s in r.json()["model_version_status"]}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("version_swap")
    save_affine(root / "swap" / "1", 1.0, 0.0)  # answers x
    save_affine(root / "half" / "1", 1.0, 0.0)
    save_affine(root / "removed" / "1", 1.0, 0.0)
    save_affine(root / "removed" / "2", 1.0, 50.0)
    config = root / "models.config"
    config.write_text("model_config_list: {\n" + "".join(
        f'  config: {{ name: "{name}" base_path: "{root / name}" model_platform: "tensorflow" }}\n'
        for name in ("swap", "half", "removed")) + "}\n")
    with ServerProcess("--model_config_file", str(config), "--file_system_poll_wait_seconds", "1",
                       log_dir=root) as server:
        yield {name: Model(server, name, root / name) for name in ("swap", "half", "removed")}


def test_new_version_under_load_drops_nothing(models, tmp_path):
    model = models["swap"]
    staging = save_affine(tmp_path / "staging", 1.0, 100.0)  # answers x + 100
    results: list[tuple[float, int, float | None]] = []
    stop = threading.Event()

    def client():
        session = requests.Session()
        url = f"{model.server.base}/v1/models/{model.name}:predict"
        while not stop.is_set():
            r = session.post(url, data='{"instances": [[1.0]]}', timeout=10)
            value = r.json()["predictions"][0][0] if r.status_code == 200 else None
            results.append((time.monotonic(), r.status_code, value))

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        # The clients are answered before the copy starts (a readiness wait, not a guess).
        wait_for(lambda: len(results) >= 10, 30, interval=0.05, what="the clients' first answers")
        shutil.copytree(staging, model.base / "2")  # a plain, non-atomic copy, as users do
        wait_for(lambda: model.states().get(2, {}).get("state") == "AVAILABLE", 60, what="version 2")
        available_at = time.monotonic()
        wait_for(lambda: model.states()[1]["state"] == "END", 30, what="version 1 to unload")
        seen = len(results)  # the load goes on a little after the unload: still no version 1 answer
        wait_for(lambda: len(results) >= seen + 20, 30, interval=0.05, what="answers after the unload")
    finally:
        stop.set()
        for t in threads:
            t.join()
    failures = [r for r in results if r[1] != 200]
    assert not failures, f"{len(failures)} failed requests, first: {failures[0]}"
    assert {r[2] for r in results} == {1.0, 101.0}
    # Once version 2 is AVAILABLE (seen by status), no answer comes from version 1 any more:
    late_old = [r for r in results if r[0] > available_at + 0.05 and r[2] == 1.0]
    assert not late_old
    assert len(results) > 50
    assert model.states()[1]["status"]["error_code"] == "OK"


def test_half_copied_version_keeps_old_serving_then_loads(models, tmp_path):
    model = models["half"]
    staging = save_affine(tmp_path / "staging", 2.0, 0.0)
    partial = model.base / "2"
    partial.mkdir()
    shutil.copy(staging / "saved_model.pb", partial / "saved_model.pb")  # variables not there yet
    status = wait_for(lambda: model.states().get(2, {}).get("state") == "END" and model.states()[2], 60,
                      what="the partial version to fail")
    assert status["status"]["error_code"] != "OK"
    assert status["status"]["error_message"]
    assert model.predict(3.0).json() == {"predictions": [[3.0]]}  # version 1 still serves
    assert model.states()[1]["state"] == "AVAILABLE"
    shutil.copytree(staging / "variables", partial / "variables")  # the copy completes
    wait_for(lambda: model.predict(3.0).json() == {"predictions": [[6.0]]}, 60, what="version 2 to serve")
    assert model.states()[2]["status"]["error_code"] == "OK"


def test_removed_version_unloads_and_older_takes_over(models):
    model = models["removed"]
    assert model.predict().json() == {"predictions": [[51.0]]}
    shutil.rmtree(model.base / "2")
    wait_for(lambda: model.predict().json() == {"predictions": [[1.0]]}, 60, what="version 1 to serve")
    wait_for(lambda: model.states()[2]["state"] == "END", 30, what="version 2 to unload")
