"""The console on a real ``modelyard serve``: its numbers are the server's, it updates live,
it escapes names, and its action needs the token."""
from __future__ import annotations

import os
import re
import shutil
import time

import numpy as np
import requests

from modelyard.datasets import load_digits_28
from tests.web.conftest import CONSOLE_TOKEN, DESKTOP, EVIL_NAME, PHONE, poll, shoot

METRICS_PATH = "/monitoring/prometheus/metrics"


def _metrics(server) -> str:
    return requests.get(server.base + METRICS_PATH, timeout=10).text


def _metric_values(text: str, metric: str, **labels: str) -> list[float]:
    """Values of every sample of ``metric`` whose labels include ``labels``."""
    values = []
    for line in text.splitlines():
        match = re.fullmatch(re.escape(metric) + r"\{(.*)\} (\S+)", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1)))
        if all(found.get(k) == v for k, v in labels.items()):
            values.append(float(match.group(2)))
    return values


def _model(state: dict, name: str) -> dict:
    return next(m for m in state["models"] if m["name"] == name)


def _state(server) -> dict:
    return requests.get(server.base + "/console/api/state", timeout=10).json()


def test_console_numbers_match_status_and_metrics(demo_server, browser, tmp_path_factory):
    url = demo_server.base + "/v1/models/my_mnist_model"
    images, _ = load_digits_28("test")
    for image in images[:7]:
        assert requests.post(url + ":predict", json={"instances": [image.tolist()]}, timeout=10).status_code == 200
    bad = requests.post(url + ":predict", json={"instances": [[1, 2, 3]]}, timeout=10)
    assert bad.status_code == 400

    state, metrics, status = _state(demo_server), _metrics(demo_server), requests.get(url, timeout=10).json()
    model = _model(state, "my_mnist_model")
    ok = _metric_values(metrics, ":tensorflow:serving:request_count", model_name="my_mnist_model", status="OK")
    total = _metric_values(metrics, ":tensorflow:serving:request_count", model_name="my_mnist_model")
    assert model["requests"]["ok"] == sum(ok) >= 7
    assert model["requests"]["total"] == sum(total) >= 8
    assert model["latency_us"]["count"] == sum(
        _metric_values(metrics, ":tensorflow:serving:request_latency_count", model_name="my_mnist_model"))
    assert np.isclose(model["latency_us"]["sum"], sum(
        _metric_values(metrics, ":tensorflow:serving:request_latency_sum", model_name="my_mnist_model")))
    # versions and states as GET /v1/models/... says; runtime as the model_runtime gauge says
    assert [(str(v["version"]), v["state"]) for v in model["versions"]] == [
        (s["version"], s["state"]) for s in status["model_version_status"]]
    for version in model["versions"]:
        if version["state"] == "AVAILABLE":
            assert _metric_values(metrics, ":modelyard:serving:model_runtime", model_name="my_mnist_model",
                                  version=str(version["version"]), runtime=version["runtime"]) == [1]
    assert model["queue"] == {"batches": 0, "rows": 0, "max_batches": 64, "max_batch_size": 8}
    evil = _model(state, EVIL_NAME)
    assert evil["labels"] == {"canary": 2, "stable": 1}
    assert {v["version"]: v["labels"] for v in evil["versions"]} == {2: ["canary"], 1: ["stable"]}

    # the page shows the same numbers (after its first poll), and the rate once traffic flows
    page = browser.new_page(viewport=DESKTOP)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(demo_server.base + "/console")
    section = page.locator("section.model[data-model='my_mnist_model']")
    page.wait_for_function("Number(document.body.dataset.polls || 0) >= 1")
    assert int(section.locator(".requests").text_content()) == model["requests"]["total"]  # no traffic since
    assert int(section.locator(".errors").text_content()) == model["requests"]["total"] - model["requests"]["ok"]
    for burst in range(3):  # a few polls' worth of traffic, so the chart has a curve
        for image in images[: 10 * (burst + 1)]:
            requests.post(url + ":predict", json={"instances": [image.tolist()]}, timeout=10)
        time.sleep(1.0)
    page.wait_for_function(
        "document.querySelector(\"section.model[data-model='my_mnist_model'] .latency\").textContent.endsWith(' ms')")
    assert section.locator(".rate").text_content().endswith("req/s")
    assert section.locator(".queue").text_content() == "0 batches, 0 rows"
    # the chart (chart.js, shared with the platform's console) is drawn: pixels other than its background
    ink = section.locator("canvas").evaluate("""(c) => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i] !== 0xf6 || d[i + 1] !== 0xf7 || d[i + 2] !== 0xfa) n++;
        return n; }""")
    assert ink > 200 and errors == [], (ink, errors)
    shoot(page, tmp_path_factory, "console-desktop")
    page.close()


def test_version_swap_appears_without_reload(demo_server, served_models, browser):
    page = browser.new_page(viewport=DESKTOP)
    page.goto(demo_server.base + "/console")
    page.evaluate("window.sameDocument = true")
    base = served_models["my_mnist_model"]
    staging = base / ".tmp-copy"
    shutil.copytree(base / "0002", staging)  # same weights: the page's toggle test compares with version 2's
    os.rename(staging, base / "0003")
    page.wait_for_function(
        """() => {
             const row = document.querySelector("section.model[data-model='my_mnist_model'] tr[data-version='3']");
             return row && row.querySelector('.state').textContent === 'AVAILABLE';
           }""", timeout=30000)
    assert page.evaluate("window.sameDocument") is True  # updated in place, not reloaded
    poll(lambda: [s["version"] for s in requests.get(demo_server.base + "/v1/models/my_mnist_model").json()
                  ["model_version_status"] if s["state"] == "AVAILABLE"] == ["3"], what="version 3 alone available")
    page.close()


def test_names_are_escaped(demo_server, browser, tmp_path_factory):
    html = requests.get(demo_server.base + "/console", timeout=10).text
    assert EVIL_NAME not in html and "&lt;img src=x onerror=window.pwned=1&gt;" in html
    context = browser.new_context(**PHONE)
    page = context.new_page()
    page.goto(demo_server.base + "/console")
    page.wait_for_function("Number(document.body.dataset.polls || 0) >= 2")
    heading = page.locator(f"section.model[data-model='{EVIL_NAME}'] h2")
    assert heading.text_content() == EVIL_NAME
    assert page.locator("section.model img").count() == 0
    assert page.evaluate("window.pwned") is None
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shoot(page, tmp_path_factory, "console-phone")
    context.close()


def test_actions_need_the_token(demo_server, browser):
    reload = demo_server.base + "/console/api/reload"
    assert requests.post(reload, data=b"{}", timeout=10).status_code == 401
    assert requests.post(reload, json={"token": "wrong"}, timeout=10).status_code == 401
    garbled = requests.post(reload, data=b"not json", timeout=10)
    assert garbled.status_code == 400 and "token" in garbled.json()["error"]
    assert requests.get(reload, timeout=10).status_code == 405
    # through the page: a wrong token is refused, the right one reloads the config file
    page = browser.new_page(viewport=DESKTOP)
    page.goto(demo_server.base + "/console")
    page.fill("#token", "wrong")
    page.click("#reload")
    page.wait_for_function("document.getElementById('action-result').textContent.includes('token')")
    page.fill("#token", CONSOLE_TOKEN)
    page.click("#reload")
    page.wait_for_function("document.getElementById('action-result').textContent.startsWith('reloaded')",
                           timeout=60000)
    page.close()
    assert requests.get(demo_server.base + "/v1/models/my_mnist_model", timeout=10).status_code == 200


def test_console_without_token_is_read_only():
    from modelyard.web.console import Console
    from modelyard.web.console.page import render

    status, body = Console(server=None, token=None).handle("POST", "/console/api/reload", b'{"token": ""}')
    assert status == 403 and b"read-only" in body
    html = render({"models": []}, can_act=False)
    assert 'id="reload"' not in html and "Read-only" in html
