"""modelyard-serving as a drop-in for tensorflow/serving (issue 49), each through podman on this machine:
the textbook's `docker run` line with podman (docs/containers.md's lines, as written but for the ports),
REST and gRPC predicts answering as `modelyard serve` on the host does, a second version dropped into the
mounted folder; --model_config_file with two models and labels; SIGTERM under load; the serving manifest
through `podman kube play`. The images are built once per source (tests/image/podman.py)."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import yaml

from modelyard.ports import free_port
from tests.doc_blocks import blocks
from tests.image import podman
from tests.serving.server_process import ServerProcess

PAGE = podman.REPO / "docs" / "containers.md"
pytestmark = pytest.mark.e2e


def page_block(first: str) -> str:
    """The docs page's block whose first line starts with ``first``."""
    (body,) = [b.body for b in blocks(PAGE.read_text()) if b.body.startswith(first)]
    return body


def published(command: str, rest: int, grpc_port: int, container: str) -> list[str]:
    """The page's `podman run` line with the test's own host ports and container name."""
    line = command.strip().replace("-p 8500:8500", f"-p 127.0.0.1:{grpc_port}:8500")
    line = line.replace("-p 8501:8501", f"-p 127.0.0.1:{rest}:8501")
    line = re.sub(r"--name \S+", f"--name {container}", line)
    return shlex.split(line)


def run_page_line(first: str, models: Path, container: str) -> tuple[str, str]:
    """Start the page's `podman run ...` line (``$MODELS`` = ``models``); the REST base and gRPC target."""
    rest, grpc_port = free_port(), free_port()
    argv = published(page_block(first).replace('"$MODELS', f'"{models}'), rest, grpc_port, container)
    assert argv[:2] == ["podman", "run"], argv
    podman.podman(*argv[1:], timeout=120)
    return f"http://127.0.0.1:{rest}", f"127.0.0.1:{grpc_port}"


def grpc_predict(target: str, model: str, images: np.ndarray, label: str | None = None):
    """The README's gRPC predict (its PredictRequest; the tensor through modelyard's TensorProto helper)."""
    from tensorflow_serving.apis import prediction_service_pb2_grpc
    from tensorflow_serving.apis.predict_pb2 import PredictRequest

    from modelyard.model.tensor_proto import from_ndarray, to_ndarray

    request = PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    if label:
        request.model_spec.version_label = label
    request.inputs["image"].CopyFrom(from_ndarray(images))
    with grpc.insecure_channel(target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return response.model_spec.version.value, to_ndarray(response.outputs["probabilities"])


def rest_predict(base: str, path: str, images: np.ndarray) -> np.ndarray:
    body = {"signature_name": "serving_default", "instances": images.tolist()}
    answer = requests.post(f"{base}/v1/models/{path}:predict", json=body, timeout=30)
    assert answer.ok, answer.text
    return np.array(answer.json()["predictions"])


def test_the_pages_build_line_makes_both_images(images):
    """docs/containers.md's `./scripts/image` (the fixture ran it with --if-changed, which builds only when
    the images are not from this source): both images carry this source's key and TF Serving's contract."""
    assert page_block("./scripts/image").strip() == "./scripts/image"
    key = subprocess.run([str(podman.REPO / "scripts" / "image"), "--key"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert len(key) == 16 and len(images) == 16  # (others' edits may have changed the source since the build)
    import json

    serving, full, platform = json.loads(podman.podman("image", "inspect", podman.SERVING, podman.SERVING_FULL,
                                                       podman.PLATFORM).stdout)
    for image in (serving, full, platform):
        assert image["Labels"]["modelyard.source"] == images
        assert image["Config"]["User"] == "1000:1000" and image["Config"]["Entrypoint"][:2] == ["/usr/bin/tini", "--"]
    assert set(serving["Config"]["ExposedPorts"]) == {"8500/tcp", "8501/tcp"}
    assert {"MODEL_BASE_PATH=/models", "MODEL_NAME=model"} <= set(serving["Config"]["Env"])
    assert serving["Healthcheck"]["Test"] == ["CMD", "/usr/local/bin/healthcheck"]
    assert full["Config"]["Entrypoint"] == serving["Config"]["Entrypoint"] and full["Config"]["Env"] == serving["Config"]["Env"]
    # The serving image holds TensorFlow's message modules, not TensorFlow: SavedModels run on the graph runtime.
    probe = ("from modelyard.model.runtime.choose_runtime import tensorflow_installed as t; import importlib.util as u; "
             "print(t(), u.find_spec('tensorflow.python.framework.ops') is None, u.find_spec('tensorflow.core.framework.tensor_pb2') "
             "is not None)")
    said = podman.podman("run", "--rm", "--entrypoint", "python3", podman.SERVING, "-c", probe).stdout.split()
    assert said == ["False", "True", "True"], said
    assert set(platform["Config"]["ExposedPorts"]) == {"8600/tcp", "8601/tcp"}
    assert "/var/lib/modelyard" in platform["Config"]["Volumes"]


def test_the_textbooks_docker_line_with_podman(images, demo_cache, tmp_path):
    """docs/containers.md's `podman run` line: REST and gRPC answer what `modelyard serve` answers on the host
    for the same version, and a 0002 copied into the mounted folder is served."""
    from modelyard.demo import demo_instances

    demo = demo_cache / "models" / "my_mnist_model"
    models = tmp_path / "models"
    shutil.copytree(demo / "0001", models / "my_mnist_model" / "0001")
    host_models = tmp_path / "host"
    shutil.copytree(demo / "0001", host_models / "0001")
    container = podman.name("my_mnist_serving")
    x = demo_instances(3)
    try:
        base, target = run_page_line("podman run -d --rm --name my_mnist_serving", models, container)
        podman.wait_available(base, "my_mnist_model", container)
        assert "runs on the graph runtime" in podman.logs(container)  # no TensorFlow in the image
        # The page's curl, on the test's port.
        curl = page_block("curl -s --retry").replace("localhost:8501", base.removeprefix("http://"))
        status = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120)
        assert '"state":"AVAILABLE"' in status.stdout.replace(" ", ""), status.stdout
        in_container = rest_predict(base, "my_mnist_model", x)
        version, by_grpc = grpc_predict(target, "my_mnist_model", x)
        assert version == 1 and np.allclose(by_grpc, in_container, atol=1e-6)
        assert list(in_container.argmax(axis=1)) == [0, 1, 2]
        with ServerProcess("--model_name", "my_mnist_model", "--model_base_path", str(host_models),
                           log_dir=tmp_path) as host:
            podman.wait_available(host.base, "my_mnist_model", container)
            assert np.allclose(rest_predict(host.base, "my_mnist_model", x), in_container, atol=1e-6)
        # A second version dropped into the mounted folder (complete first, then renamed in: a copy in place).
        shutil.copytree(demo / "0002", models / "my_mnist_model" / ".0002.partial")
        (models / "my_mnist_model" / ".0002.partial").rename(models / "my_mnist_model" / "0002")
        podman.wait_available(base, "my_mnist_model", container, timeout=240, version="2")
        version, _ = grpc_predict(target, "my_mnist_model", x)
        assert version == 2
        answer = requests.get(f"{base}/v1/models/my_mnist_model", timeout=10).json()
        assert {s["version"] for s in answer["model_version_status"] if s["state"] == "AVAILABLE"} == {"2"}, answer
        # The image runs as a non-root user, with TF Serving's defaults in its environment.
        inspect = podman.podman("inspect", "--format", "{{.Config.User}} {{.Config.Env}}", container).stdout
        assert inspect.startswith("1000:1000") and "MODEL_BASE_PATH=/models" in inspect, inspect
        podman.podman(*shlex.split(page_block("podman stop my_mnist_serving").replace("my_mnist_serving", container))[1:],
                      timeout=60)
        assert not podman.running(container)
    finally:
        podman.remove(container)


def test_a_model_config_file_with_two_models_and_labels(images, demo_cache, generated_tfserving, tmp_path):
    """The page's config sample and `--model_config_file` line: both models answer, each label its version."""
    from modelyard.demo import demo_instances

    models = tmp_path / "models"
    shutil.copytree(demo_cache / "models" / "my_mnist_model", models / "my_mnist_model")
    shutil.copytree(generated_tfserving / "saved_model_half_plus_two_cpu", models / "half_plus_two")
    (models / "models.config").write_text(page_block("model_config_list {"))
    container = podman.name("my_models")
    try:
        base, target = run_page_line("podman run -d --rm --name my_models", models, container)
        for version in ("1", "2"):
            podman.wait_available(base, "my_mnist_model", container, version=version)
        podman.wait_available(base, "half_plus_two", container)
        x = demo_instances(2)
        stable = rest_predict(base, "my_mnist_model/labels/stable", x)
        canary = rest_predict(base, "my_mnist_model/labels/canary", x)
        assert np.allclose(stable, rest_predict(base, "my_mnist_model/versions/1", x))
        assert np.allclose(canary, rest_predict(base, "my_mnist_model/versions/2", x))
        assert not np.allclose(stable, canary)
        assert grpc_predict(target, "my_mnist_model", x, label="canary")[0] == 2
        halves = requests.post(f"{base}/v1/models/half_plus_two:predict", json={"instances": [1.0, 2.0]}, timeout=30)
        assert halves.json() == {"predictions": [2.5, 3.0]}, halves.text
    finally:
        podman.remove(container)


def _refused(exc: requests.ConnectionError) -> bool:
    """A request the server never took: the connection was refused, or not made at all, before it was sent."""
    return isinstance(exc, requests.ConnectTimeout) or "NewConnectionError" in repr(exc)


def test_sigterm_under_load_answers_every_request_it_took(images, demo_cache, tmp_path):
    """`podman stop` (SIGTERM) with four clients sending predicts on kept-alive connections: every request
    the server took is answered 200, the others are refused at connect (never reset or half answered), and
    the container exits by itself within the drain time, status 0 (no SIGKILL)."""
    models = tmp_path / "models"
    shutil.copytree(demo_cache / "models" / "my_mnist_model" / "0001", models / "my_mnist_model" / "0001")
    container = podman.name("drain")
    rest = free_port()
    body = {"instances": np.zeros((2, 28, 28), dtype=np.uint8).tolist()}
    answered, failures, refused = [0], [], []
    lock = threading.Lock()

    def client() -> None:
        session = requests.Session()
        while True:
            try:
                answer = session.post(f"http://127.0.0.1:{rest}/v1/models/my_mnist_model:predict", json=body,
                                      timeout=(2, 30))
            except requests.ConnectionError as exc:
                with lock:
                    (refused if _refused(exc) else failures).append(repr(exc)[-300:])
                return
            except requests.RequestException as exc:
                with lock:
                    failures.append(repr(exc)[-300:])
                return
            with lock:
                if answer.status_code == 200 and len(answer.json()["predictions"]) == 2:
                    answered[0] += 1
                else:
                    failures.append(f"{answer.status_code} {answer.text[:200]}")

    try:
        podman.podman("run", "-d", "--name", container, "-v", f"{models / 'my_mnist_model'}:/models/my_mnist_model",
                      "-p", f"127.0.0.1:{rest}:8501", "-e", "MODEL_NAME=my_mnist_model", podman.SERVING)
        podman.wait_available(f"http://127.0.0.1:{rest}", "my_mnist_model", container)
        clients = [threading.Thread(target=client) for _ in range(4)]
        for thread in clients:
            thread.start()
        deadline = time.monotonic() + 60
        while answered[0] < 200 and not failures and time.monotonic() < deadline:
            time.sleep(0.05)
        assert answered[0] >= 200 and not failures, (answered, failures)
        before = answered[0]
        started = time.monotonic()
        podman.podman("stop", "--time", "30", container, timeout=90)
        stopped_in = time.monotonic() - started
        for thread in clients:
            thread.join(60)
        assert not failures, failures
        assert len(refused) == 4 and answered[0] >= before, (answered, refused)
        state = podman.podman("inspect", "--format", "{{.State.ExitCode}}", container).stdout.strip()
        assert state == "0" and stopped_in < 30, (state, stopped_in, podman.logs(container))
    finally:
        podman.remove(container)


def test_kube_play_of_the_serving_manifest_becomes_ready_and_answers(images, demo_cache, tmp_path):
    """deploy/serving.yaml through `podman kube play` (the page's line): the Deployment's pod comes up, its probe
    (podman 4.3 runs the livenessProbe as the container's health check; the readinessProbe asks the same URL,
    which answers 200) passes, and the pod answers a predict. The Service is Kubernetes' (kube play has none).
    The claim is a podman volume of the test's own name, the Deployment's name the test's own too."""
    from modelyard.demo import demo_instances

    deployment, service = yaml.safe_load_all((podman.REPO / "deploy" / "serving.yaml").read_text())
    assert deployment["kind"] == "Deployment" and service["kind"] == "Service"
    (spec,) = deployment["spec"]["template"]["spec"]["containers"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert spec[probe]["httpGet"] == {"path": "/v1/models/my_mnist_model", "port": 8501}, spec[probe]
    assert spec["image"] == podman.SERVING
    assert page_block("podman kube play").strip() == "podman kube play deploy/serving.yaml"
    suffix = podman.name("t").split("-")[1]
    volume, name = f"modelyard-models-{suffix}", f"my-mnist-serving-{suffix}"
    text = (podman.REPO / "deploy" / "serving.yaml").read_text()
    play = tmp_path / "serving.yaml"
    play.write_text(text.replace("claimName: modelyard-models", f"claimName: {volume}").replace(
        "  name: my-mnist-serving\n  labels", f"  name: {name}\n  labels"))
    podman.podman("volume", "create", volume)
    try:
        mountpoint = Path(podman.podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout.strip())
        shutil.copytree(demo_cache / "models" / "my_mnist_model" / "0001", mountpoint / "my_mnist_model" / "0001")
        subprocess.run(["chown", "-R", "1000:1000", str(mountpoint)], check=True)
        podman.podman("kube", "play", str(play), timeout=180)
        container = f"{name}-pod-0-serving"
        assert podman.running(container), podman.podman("ps", "-a").stdout
        address = podman.podman("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                                container).stdout.strip()
        assert address, podman.podman("inspect", container).stdout[-2000:]
        base = f"http://{address}:8501"
        podman.wait_available(base, "my_mnist_model", container)
        assert requests.get(f"{base}{spec['readinessProbe']['httpGet']['path']}", timeout=5).status_code == 200
        # The probe as podman runs it (no systemd here to time it: run now, as its timer would).
        healthcheck = podman.podman("inspect", "--format", "{{json .Config.Healthcheck.Test}}", container).stdout
        assert "http://localhost:8501/v1/models/my_mnist_model" in healthcheck, healthcheck
        podman.podman("healthcheck", "run", container)
        assert podman.podman("inspect", "--format", "{{.State.Health.Status}}", container).stdout.strip() == "healthy"
        assert list(rest_predict(base, "my_mnist_model", demo_instances(3)).argmax(axis=1)) == [0, 1, 2]
    finally:
        podman.podman("kube", "down", str(play), timeout=120, check=False)
        podman.podman("volume", "rm", "--force", volume, check=False)
