"""Browser tests: one headless Chromium (Debian's) per session, sites converted once, real servers.

A missing Chromium, Playwright or npm FAILS the tests with the command that installs it:
these are real parts of the feature, never skipped.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import modelyard  # noqa: F401  (sets the TF/Keras environment before TensorFlow is imported)

from tests.serving.server_process import ServerProcess

CHROMIUM_NAMES = ("chromium", "chromium-headless-shell", "chromium-browser")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 3, "is_mobile": True, "has_touch": True}


def chromium_path() -> str:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    for path in ("/usr/lib/chromium/chromium", "/usr/lib/chromium/chrome-headless-shell"):
        if os.path.exists(path):
            return path
    pytest.fail("Chromium not found: install Debian's browser with `apt-get install -y chromium` "
                "(or `apt-get install -y chromium-headless-shell`)", pytrace=False)


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright for Python is missing: pip install -e '.[test]' (or pip install playwright); "
                    "the browser itself comes from apt-get install -y chromium", pytrace=False)
    executable = chromium_path()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="session")
def demo_base(demo_cache) -> Path:
    """The demo digits model (0001: one hidden layer, 0002: two), from the run's one demo cache
    (tests/conftest.py)."""
    from modelyard.demo import ensure_demo_model

    return ensure_demo_model(cache_dir=demo_cache, log=lambda _m: None)


def _convert(base: Path, out: Path, *extra: str) -> Path:
    from modelyard.cli import main

    if shutil.which("npm") is None and not os.environ.get("MODELYARD_LITERTJS_DIR"):
        from modelyard.web.runtime_files import cache_dir

        if not (cache_dir() / "node_modules").is_dir():
            pytest.fail("npm not found and LiteRT.js not cached: apt-get install -y npm (it fetches "
                        "@litertjs/core from the npm registry on first use)", pytrace=False)
    code = main(["convert", str(base), "--to", "web", "-o", str(out), "--no-report", *extra])
    assert code == 0, f"modelyard convert --to web {' '.join(extra)} exited {code}"
    return out


@pytest.fixture(scope="session")
def sites(demo_base, tmp_path_factory) -> dict[str, Path]:
    """The demo's version 2 as a web site in every quantization mode."""
    root = tmp_path_factory.mktemp("sites")
    return {
        "none": _convert(demo_base, root / "none"),
        "dynamic": _convert(demo_base, root / "dynamic", "--quantize", "dynamic"),
        "float16": _convert(demo_base, root / "float16", "--quantize", "float16"),
        # uint8 outputs too, so the page's dequantization is exercised
        "int8": _convert(demo_base, root / "int8", "--quantize", "int8", "--representative-data", "digits",
                         "--io-dtype", "uint8"),
    }


RGB_LABELS = ["red", "green", "blue", "dark", "light"]


@pytest.fixture(scope="session")
def rgb_site(tmp_path_factory) -> Path:
    """A small RGB classifier (32x32x3 in 0..1, five named classes) as a site: --scale and --labels."""
    import keras
    import numpy as np

    root = tmp_path_factory.mktemp("rgb")
    keras.utils.set_random_seed(3)
    inputs = keras.Input((32, 32, 3), name="photo")
    x = keras.layers.Conv2D(4, 3, strides=2, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(5, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.predict(np.zeros((1, 32, 32, 3), np.float32), verbose=0)
    model.save(root / "colours.keras")
    (root / "labels.txt").write_text("\n".join(RGB_LABELS) + "\n")
    return _convert(root / "colours.keras", root / "site", "--scale", "1", "--labels", str(root / "labels.txt"))


class WebProcess:
    """``modelyard web SITE --port 0`` as a real process; the URL is read from its first line."""

    def __init__(self, site: Path, log_dir: Path):
        self.log = log_dir / f"web-{site.name}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "modelyard", "web", str(site), "--port", "0"],
                                         stdout=subprocess.PIPE, stderr=log, text=True)
        self.url = ""

    def wait_ready(self) -> str:
        line = self.proc.stdout.readline()
        if " at http://" not in line:
            raise RuntimeError(f"modelyard web did not start: {line}{self.log.read_text()[-2000:]}")
        self.url = line.rsplit(" at ", 1)[1].strip()
        return self.url

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture(scope="session")
def site_urls(sites, tmp_path_factory):
    logs = tmp_path_factory.mktemp("web-logs")
    servers = {}
    try:
        for mode, site in sites.items():  # started together: each pays the CLI's import time at once
            servers[mode] = WebProcess(site, logs)
        yield {mode: server.wait_ready() for mode, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()


CONSOLE_TOKEN = "console-test-token"
EVIL_NAME = "<img src=x onerror=window.pwned=1>"


@pytest.fixture(scope="session")
def served_models(demo_base, tmp_path_factory) -> dict[str, Path]:
    """Copies of the demo model a test may add versions to: the digits model, and the same
    weights under a name that is HTML (the console must show it as text)."""
    root = tmp_path_factory.mktemp("served")
    bases = {"my_mnist_model": root / "mnist", EVIL_NAME: root / "evil"}
    for base in bases.values():
        shutil.copytree(demo_base, base)
    return bases


@pytest.fixture(scope="session")
def demo_server(served_models, monitoring_config, tmp_path_factory):
    """One ``modelyard serve`` for the page's toggle and the console: CORS on, batching on,
    Prometheus metrics, labels, and a console token."""
    folder = tmp_path_factory.mktemp("serve-config")
    (folder / "models.config").write_text(
        "model_config_list {\n"
        f'  config {{ name: "my_mnist_model" base_path: "{served_models["my_mnist_model"]}" model_platform: "tensorflow" }}\n'
        f'  config {{ name: "{EVIL_NAME}" base_path: "{served_models[EVIL_NAME]}" model_platform: "tensorflow"\n'
        "    model_version_policy { specific { versions: 1 versions: 2 } }\n"
        '    version_labels { key: "stable" value: 1 } version_labels { key: "canary" value: 2 } }\n'
        "}\n"
    )
    (folder / "batching.config").write_text(
        "max_batch_size { value: 8 }\nbatch_timeout_micros { value: 1000 }\n"
        "max_enqueued_batches { value: 64 }\nnum_batch_threads { value: 1 }\n"
    )
    (folder / "token").write_text(CONSOLE_TOKEN + "\n")
    with ServerProcess("--model_config_file", str(folder / "models.config"),
                       "--monitoring_config_file", str(monitoring_config),
                       "--enable_batching", "--batching_parameters_file", str(folder / "batching.config"),
                       "--console_token_file", str(folder / "token"),
                       "--rest_api_enable_cors_support", log_dir=tmp_path_factory.mktemp("serve-logs")) as server:
        yield server


def open_page(browser, url: str, **context_options):
    """A new page at ``url``, waited until the model has made its first prediction."""
    context = browser.new_context(**context_options)
    page = context.new_page()
    page.goto(url)
    page.wait_for_function("window.modelyard && (window.modelyard.ready || window.modelyard.error)", timeout=30000)
    error = page.evaluate("window.modelyard.error")
    assert error is None, f"the page failed: {error}"
    return page


def wait_idle(page) -> None:
    page.wait_for_function("window.modelyard.idle()", timeout=10000)


def screenshot_dir(tmp_path_factory) -> Path:
    """The session's tmp dir, or $MODELYARD_SCREENSHOTS (e.g. bench/results/screenshots) to keep them."""
    chosen = os.environ.get("MODELYARD_SCREENSHOTS")
    return Path(chosen) if chosen else tmp_path_factory.getbasetemp() / "screenshots"


def shoot(page, tmp_path_factory, name: str) -> Path:
    """A full-page screenshot in CSS pixels (a phone's 3x device pixels would triple each side), as
    a JPEG: looked at by eye once, kept small."""
    path = screenshot_dir(tmp_path_factory) / f"{name}.jpg"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True, type="jpeg", quality=70, scale="css")
    assert 1000 < path.stat().st_size < 300_000
    return path


def poll(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
