"""The platform console's Experiments page in a real browser (the session's Chromium): an experiment's runs
side by side with their time-series chart, and "open in TensorBoard" starting the open-source TensorBoard over
the experiment's TensorBoard resource, where the scalars the SDK's uploader sent from a training's event files
are shown. A platform of this module's own: the session platform's tests run in the other worker
(tests/parallel.py keeps each session process's users together)."""
from __future__ import annotations

import json

import pytest
import requests

from tests.platform.conftest import _env, start_platform


@pytest.fixture(scope="module")
def console_platform(tmp_path_factory):
    p = start_platform(tmp_path_factory, "console-platform", _env(), [])
    try:
        yield p
    finally:
        p.cleanup()


@pytest.fixture(scope="module")
def sdk(console_platform):
    import google.auth
    import google.auth.credentials
    from google.cloud import aiplatform

    saved = google.auth.default  # the SDK asks for Google credentials on experiment init; a local user has none
    google.auth.default = lambda *a, **k: (google.auth.credentials.AnonymousCredentials(), "local")
    aiplatform.init(project="local", location="us-central1", api_endpoint=console_platform.url, api_transport="rest",
                    credentials=google.auth.credentials.AnonymousCredentials())
    yield aiplatform
    aiplatform.metadata.metadata._experiment_tracker.reset()
    google.auth.default = saved


def test_runs_side_by_side_and_tensorboard_opened_from_the_console(browser, sdk, console_platform, tmp_path):
    import tensorflow as tf

    board = sdk.Tensorboard.create(display_name="console-tb")
    sdk.init(experiment="exp-console", experiment_tensorboard=board)
    for name, lr in (("run-a", 0.1), ("run-b", 0.01)):
        with sdk.start_run(name):
            sdk.log_params({"lr": lr})
            sdk.log_metrics({"accuracy": 1 - lr})
            for step in range(3):
                sdk.log_time_series_metrics({"loss": lr * (3 - step)})
    # A training's TensorBoard event files, sent by the SDK's uploader into the same TensorBoard resource.
    with tf.summary.create_file_writer(str(tmp_path / "logs" / "train")).as_default():
        for step in range(4):
            tf.summary.scalar("epoch_loss", 1.0 / (step + 1), step=step)
    sdk.upload_tb_log(tensorboard_id=board.name, tensorboard_experiment_name="uploaded",
                      logdir=str(tmp_path / "logs"))

    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(f"{console_platform.url}/console/experiments")
        section = page.locator('section[data-experiment="exp-console"]')
        rows = section.locator("tr.run")
        assert rows.count() == 2
        assert [rows.nth(i).locator("td").nth(0).inner_text() for i in range(2)] == ["run-a", "run-b"]
        head = [h.inner_text() for h in section.locator("th").all()]
        assert rows.nth(1).locator("td").nth(head.index("param.lr")).inner_text() == "0.01"
        # The loss chart: one line per run, drawn by the page's script on its canvas.
        canvas = section.locator('figure.series:has(figcaption:text-is("loss")) canvas')
        lines = json.loads(canvas.get_attribute("data-series"))
        assert [(line["label"], [p[1] for p in line["points"]]) for line in lines] == [
            ("run-a", pytest.approx([0.3, 0.2, 0.1])), ("run-b", pytest.approx([0.03, 0.02, 0.01]))]
        assert page.evaluate("(c) => c.getContext('2d').getImageData(0, 0, c.width, c.height).data.some((v) => v)",
                             canvas.element_handle())

        section.locator("button.open-tb").click()
        # TensorBoard's own page (another port), started on demand.
        page.wait_for_url(lambda url: not url.startswith(console_platform.url), timeout=120_000)
        tensorboard = page.url.split("#")[0].rstrip("/")
        page.wait_for_selector("text=epoch_loss", timeout=60_000)  # its scalars dashboard lists the uploaded tag
        runs = requests.get(f"{tensorboard}/data/runs", timeout=10).json()
        assert isinstance(runs, list), (page.url, runs)
        assert {"exp-console/run-a", "exp-console/run-b", "uploaded/train"} <= set(runs)
        shown = requests.get(f"{tensorboard}/data/plugin/scalars/scalars", timeout=10,
                             params={"run": "uploaded/train", "tag": "epoch_loss"}).json()
        assert [(step, value) for _wall, step, value in shown] == [
            (0, 1.0), (1, pytest.approx(0.5)), (2, pytest.approx(1 / 3)), (3, pytest.approx(0.25))]
    finally:
        page.close()
