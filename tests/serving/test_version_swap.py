"""Must-show 3 and 4: a new version copied in under load, and a half-copied version directory."""
from __future__ import annotations

import json
import shutil
import threading
import time

import requests

from tests.serving.affine_models import save_affine
from tests.serving.server_process import ServerProcess, wait_for


def predict(server, x=1.0):
    r = requests.post(server.base + "/v1/models/m:predict", data=json.dumps({"instances": [[x]]}), timeout=10)
    return r


def states(server):
    r = requests.get(server.base + "/v1/models/m")
    return {int(s["version"]): s for s in r.json()["model_version_status"]}


def test_new_version_under_load_drops_nothing(tmp_path):
    base = tmp_path / "m"
    save_affine(base / "1", 1.0, 0.0)  # answers x
    staging = save_affine(tmp_path / "staging", 1.0, 100.0)  # answers x + 100
    with ServerProcess("--model_name", "m", "--model_base_path", str(base),
                       "--file_system_poll_wait_seconds", "1", log_dir=tmp_path) as server:
        results: list[tuple[float, int, float | None]] = []
        stop = threading.Event()

        def client():
            session = requests.Session()
            while not stop.is_set():
                r = session.post(server.base + "/v1/models/m:predict", data='{"instances": [[1.0]]}', timeout=10)
                value = r.json()["predictions"][0][0] if r.status_code == 200 else None
                results.append((time.monotonic(), r.status_code, value))

        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.5)
            shutil.copytree(staging, base / "2")  # a plain, non-atomic copy, as users do
            wait_for(lambda: states(server).get(2, {}).get("state") == "AVAILABLE", 60, what="version 2")
            available_at = time.monotonic()
            wait_for(lambda: states(server)[1]["state"] == "END", 30, what="version 1 to unload")
            time.sleep(1.0)
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
        assert states(server)[1]["status"]["error_code"] == "OK"


def test_half_copied_version_keeps_old_serving_then_loads(tmp_path):
    base = tmp_path / "m"
    save_affine(base / "1", 1.0, 0.0)
    staging = save_affine(tmp_path / "staging", 2.0, 0.0)
    with ServerProcess("--model_name", "m", "--model_base_path", str(base),
                       "--file_system_poll_wait_seconds", "1", log_dir=tmp_path) as server:
        partial = base / "2"
        partial.mkdir()
        shutil.copy(staging / "saved_model.pb", partial / "saved_model.pb")  # variables not there yet
        status = wait_for(lambda: states(server).get(2, {}).get("state") == "END" and states(server)[2], 60,
                          what="the partial version to fail")
        assert status["status"]["error_code"] != "OK"
        assert status["status"]["error_message"]
        assert predict(server, 3.0).json() == {"predictions": [[3.0]]}  # version 1 still serves
        assert states(server)[1]["state"] == "AVAILABLE"
        shutil.copytree(staging / "variables", partial / "variables")  # the copy completes
        wait_for(lambda: predict(server, 3.0).json() == {"predictions": [[6.0]]}, 60, what="version 2 to serve")
        assert states(server)[2]["status"]["error_code"] == "OK"


def test_removed_version_unloads_and_older_takes_over(tmp_path):
    base = tmp_path / "m"
    save_affine(base / "1", 1.0, 0.0)
    save_affine(base / "2", 1.0, 50.0)
    with ServerProcess("--model_name", "m", "--model_base_path", str(base),
                       "--file_system_poll_wait_seconds", "1", log_dir=tmp_path) as server:
        assert predict(server).json() == {"predictions": [[51.0]]}
        shutil.rmtree(base / "2")
        wait_for(lambda: predict(server).json() == {"predictions": [[1.0]]}, 60, what="version 1 to serve")
        wait_for(lambda: states(server)[2]["state"] == "END", 30, what="version 2 to unload")
