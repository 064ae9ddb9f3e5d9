"""modelyard-platform's image (issue 49, must-show 4): the textbook's Vertex cells (tests/platform/
test_textbook_vertex.py's copy of them) against a platform in a container, then the container started
again on the same volume: the model, its endpoint (replicas started again) and the stored objects are
there, and the rest of the cells (undeploy, the batch prediction job, run inside the container, clean-up)
run. The lines are docs/containers.md's, with the test's own ports and names."""
from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from modelyard.ports import free_port
from tests.image import podman
from tests.image.test_serving_image import page_block
from tests.platform.test_textbook_vertex import CELLS, PREAMBLE, _notebook_process_state, _run

pytestmark = pytest.mark.e2e


def _start(volume: str, container: str, api: int, storage: int) -> str:
    """The page's `podman run` line of the platform, on the test's ports (the same inside and out: the
    platform tells clients its storage's port) and volume; waits until the API answers."""
    line = page_block("podman volume create modelyard-state").splitlines()[1]
    line = line.replace("modelyard-state", volume).replace("--name modelyard_platform", f"--name {container}")
    line = line.replace("-p 8600:8600 -p 8601:8601", f"-p 127.0.0.1:{api}:{api} -p 127.0.0.1:{storage}:{storage}")
    podman.podman(*shlex.split(line)[1:], "--port", str(api), "--storage-port", str(storage))
    url = f"http://127.0.0.1:{api}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/v1/projects/my_project/locations/us-central1/models", timeout=2).ok:
                return url
        except requests.RequestException:
            pass
        assert podman.running(container), podman.logs(container)
        time.sleep(0.5)
    raise AssertionError(podman.logs(container))


def test_the_textbooks_vertex_cells_against_the_platform_image_survive_a_restart(images, demo_cache, tmp_path):
    from google.cloud.aiplatform import jobs as sdk_jobs

    from modelyard.datasets import load_digits_28

    shutil.copytree(demo_cache / "models" / "my_mnist_model" / "0001", tmp_path / "my_mnist_model" / "0001")
    X_test, y_test = load_digits_28("test")
    volume, container = podman.name("modelyard-state"), podman.name("modelyard_platform")
    api, storage = free_port(), free_port()
    assert page_block("podman volume create modelyard-state").splitlines()[0] == "podman volume create modelyard-state"
    podman.podman("volume", "create", volume)
    cells = dict(CELLS)
    try:
        url = _start(volume, container, api, storage)
        ns = {"os": os, "sys": __import__("sys"), "json": __import__("json"), "Path": __import__("pathlib").Path,
              "np": np, "X_test": X_test, "y_test": y_test, "X_new": X_test[:3],
              "PLATFORM": url, "STORAGE": f"http://127.0.0.1:{storage}"}
        with _notebook_process_state():
            os.chdir(tmp_path)
            sdk_jobs._JOB_WAIT_TIME = 0.5
            _run(PREAMBLE, ns)
            for number in (62, 63, 64, 68, 70, 71):  # bucket, upload, model, endpoint, deploy, predict
                _run(cells[number], ns)
            first = np.array(ns["response"].predictions)
            assert first.shape == (3, 10) and np.allclose(first.sum(axis=1), 1, atol=1e-4)

            # The same volume, a new container: the registry, the endpoint's replica and the objects.
            podman.podman("stop", "--time", "30", container, timeout=90)
            podman.remove(container)
            _start(volume, container, api, storage)
            aiplatform = ns["aiplatform"]
            (model,) = aiplatform.Model.list(filter='display_name="mnist"')
            assert model.uri == "gs://my_bucket/my_mnist_model/0001"
            assert [b.name for b in ns["bucket"].list_blobs(prefix="my_mnist_model/0001/saved_model.pb")]
            deadline = time.monotonic() + 240
            while True:  # the deployment's replica runs again; until then the gateway says UNAVAILABLE
                try:
                    _run(cells[71], ns)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
            np.testing.assert_allclose(ns["response"].predictions, first, rtol=1e-5, atol=1e-6)
            # The rest of the cells: undeploy, the batch prediction job (run inside the container), clean-up.
            for number in (72, 73, 75, 76, 77, 78, 79, 80, 81, 83):
                _run(cells[number], ns)
                if number == 76:  # (read before cell 83 deletes the job)
                    assert ns["batch_prediction_job"].state.name == "JOB_STATE_SUCCEEDED"
            assert len(ns["y_probas"]) == 100 and ns["accuracy"] > 0.8
    finally:
        podman.remove(container)
        podman.podman("volume", "rm", "--force", volume, check=False)


def test_kube_play_of_the_platform_manifest_serves_the_api_with_its_state_on_the_claim(images, tmp_path):
    """deploy/platform.yaml through `podman kube play`: its PersistentVolumeClaim becomes a podman volume, the
    pod's platform answers the Vertex API and the storage API, and its store is on that volume. (The
    readinessProbe and the Service are Kubernetes': podman 4.3 runs neither.)"""
    import yaml

    claim, deployment, service = yaml.safe_load_all((podman.REPO / "deploy" / "platform.yaml").read_text())
    assert [claim["kind"], deployment["kind"], service["kind"]] == ["PersistentVolumeClaim", "Deployment", "Service"]
    suffix = podman.name("t").split("-")[1]
    volume, name = f"modelyard-state-{suffix}", f"modelyard-platform-{suffix}"
    text = (podman.REPO / "deploy" / "platform.yaml").read_text()
    text = text.replace("  name: modelyard-state\n", f"  name: {volume}\n").replace(
        "claimName: modelyard-state", f"claimName: {volume}").replace(
        "  name: modelyard-platform\n  labels", f"  name: {name}\n  labels")
    play = tmp_path / "platform.yaml"
    play.write_text(text)
    try:
        podman.podman("kube", "play", str(play), timeout=180)
        container = f"{name}-pod-0-platform"
        address = podman.podman("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                                container).stdout.strip()
        probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
        deadline = time.monotonic() + 300
        while True:
            try:
                if requests.get(f"http://{address}:{probe['port']}{probe['path']}", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert podman.running(container) and time.monotonic() < deadline, podman.logs(container)
            time.sleep(0.5)
        buckets = requests.get(f"http://{address}:8601/storage/v1/b", params={"project": "local"}, timeout=10)
        assert buckets.json()["kind"] == "storage#buckets", buckets.text
        mountpoint = podman.podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout.strip()
        assert (Path(mountpoint) / "platform.db").is_file()
    finally:
        podman.podman("kube", "down", str(play), timeout=120, check=False)
        podman.podman("volume", "rm", "--force", volume, check=False)
