"""The web app of issue 32 in headless Chromium: any picture in (file, drop, paste; phone sizes),
the model's own preprocessing, top class and top-5 bars, installable, offline, updated by a new convert."""
from __future__ import annotations

import base64
import io
import json
import shutil
import threading

import numpy as np
import pytest
import requests
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from modelyard.datasets import load_digits_28
from tests.web.conftest import (CHROMIUM_FLAGS, DESKTOP, PHONE, RGB_LABELS, WebProcess, _convert, chromium_path, open_page,
                               poll, shoot, wait_idle)
from tests.web.test_page import python_litert


def encode(image: np.ndarray, fmt: str, **options) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).save(out, format=fmt, **options)
    return out.getvalue()


def give_file(page, name: str, mime: str, data: bytes) -> list[int]:
    """Choose ``data`` in the page's file input, as a user does; the input the model then saw."""
    before = int(page.evaluate("document.body.dataset.predictions || 0"))
    page.set_input_files("#file", files=[{"name": name, "mimeType": mime, "buffer": data}])
    page.wait_for_function(f"Number(document.body.dataset.predictions) > {before} || document.body.dataset.pictureError",
                           timeout=20000)
    wait_idle(page)
    assert page.evaluate("document.body.dataset.pictureError") is None
    return page.evaluate("window.modelyard.last.input")


def shown(page) -> dict:
    """What the page shows: the top class element and the bars' (class, label, value)."""
    bars = page.locator("[data-testid=probabilities] .bar")
    return {
        "top": page.text_content("[data-testid=top-class]"),
        "top_cls": page.get_attribute("[data-testid=top-class]", "data-cls"),
        "bars": [(int(bars.nth(i).get_attribute("data-cls")), bars.nth(i).locator(".name").text_content(),
                  float(bars.nth(i).locator(".value").text_content())) for i in range(bars.count())],
        "ms": page.text_content("[data-testid=inference-time]"),
    }


@pytest.fixture(scope="module")
def digit():
    """A held-out digit the model classifies right, and its 28x28 pixels."""
    images, labels = load_digits_28("test")
    return images[5], int(labels[5])


def test_png_and_jpeg_digits_from_a_phone_are_classified_as_python_does(browser, sites, site_urls, digit,
                                                                        tmp_path_factory):
    image, label = digit
    page = open_page(browser, site_urls["none"], **PHONE)
    assert page.get_attribute("#file", "accept") == "image/*" and page.get_attribute("#file", "capture")
    # A PNG the size of a phone photo's side: 30x nearest-neighbour; the page's area average undoes it exactly.
    big = np.stack([image.repeat(30, 0).repeat(30, 1)] * 3, axis=-1)  # RGB: the grey conversion runs too
    seen = np.array(give_file(page, "digit.png", "image/png", encode(big, "PNG")), np.uint8).reshape(28, 28)
    np.testing.assert_array_equal(seen, image)
    probs = np.array(page.evaluate("window.modelyard.last.page.values"))
    python = python_litert(sites["none"], seen[None])[0]
    np.testing.assert_allclose(probs, python, rtol=0, atol=1e-4)
    assert python.argmax() == label
    ui = shown(page)
    assert ui["top"] == str(label) and ui["top_cls"] == str(label) and ui["ms"].endswith(" ms")
    assert [c for c, _, _ in ui["bars"]] == list(np.argsort(-python, kind="stable")[:5])
    np.testing.assert_allclose([v for _, _, v in ui["bars"]], np.sort(python)[::-1][:5], atol=6e-4)  # 3 decimals
    shoot(page, tmp_path_factory, "app-phone-png")

    # A portrait JPEG (3:4, a phone camera's shape): the digit in its centre square, cropped to it.
    portrait = np.zeros((1440, 1080), np.uint8)
    portrait[188:188 + 1064, 8:8 + 1064] = image.repeat(38, 0).repeat(38, 1)
    seen = np.array(give_file(page, "digit.jpg", "image/jpeg", encode(portrait, "JPEG", quality=92)), np.uint8)
    seen = seen.reshape(28, 28)
    assert np.abs(seen.astype(int) - image).mean() < 12, "the cropped, resized JPEG is not the digit"
    probs = np.array(page.evaluate("window.modelyard.last.page.values"))
    python = python_litert(sites["none"], seen[None])[0]
    np.testing.assert_allclose(probs, python, rtol=0, atol=1e-4)
    assert python.argmax() == label and page.get_attribute("[data-testid=top-class]", "data-cls") == str(label)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "horizontal scroll on a phone"
    page.context.close()


def area_resize(image: np.ndarray, size: int) -> np.ndarray:
    """The page's centre crop and area average, for a side that divides evenly."""
    h, w = image.shape[:2]
    side = min(h, w)
    crop = image[(h - side) // 2:(h - side) // 2 + side, (w - side) // 2:(w - side) // 2 + side].astype(np.float64)
    k = side // size
    return crop.reshape(size, k, size, k, -1).mean(axis=(1, 3))


def photo(width: int = 1024, height: int = 768) -> np.ndarray:
    """A photo-like RGB picture: gradients and a few discs."""
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([x * 255 / width, y * 255 / height, 128 + 100 * np.sin(x / 60.0)], axis=-1)
    for cx, cy, r, colour in ((300, 300, 120, (250, 30, 30)), (700, 450, 160, (20, 40, 230))):
        image[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = colour
    return image.clip(0, 255).astype(np.uint8)


def test_an_rgb_photo_goes_through_the_preprocessing(browser, rgb_site, tmp_path_factory):
    info = json.loads((rgb_site / "model.json").read_text())
    expected = {"height": 32, "width": 32, "channels": 3, "grey": False, "range": [0.0, 1.0], "fit": "crop"}
    assert {k: info["preprocess"][k] for k in expected} == expected
    assert info["labels"] == RGB_LABELS and info["draw"] is False
    server = WebProcess(rgb_site, tmp_path_factory.mktemp("rgb-logs"))
    try:
        page = open_page(browser, server.wait_ready(), viewport=DESKTOP)
        assert page.is_hidden("#pad") and page.text_content("[data-testid=top-class]").startswith("–")
        picture = photo()
        seen = np.array(give_file(page, "photo.jpg", "image/jpeg", encode(picture, "JPEG", quality=90)), np.uint8)
        seen = seen.reshape(32, 32, 3)
        expected = area_resize(picture, 32)
        assert np.abs(seen - expected).mean() < 2.0 and np.abs(seen - expected).max() < 12
        probs = np.array(page.evaluate("window.modelyard.last.page.values"))
        python = python_litert(rgb_site, (seen / 255.0)[None])[0]  # --scale 1: white is 1.0
        np.testing.assert_allclose(probs, python, rtol=0, atol=1e-4)
        ui = shown(page)
        assert ui["top"] == RGB_LABELS[python.argmax()] and len(ui["bars"]) == 5
        assert [name for _, name, _ in ui["bars"]] == [RGB_LABELS[k] for k in np.argsort(-python, kind="stable")]
        assert page.evaluate("[document.getElementById('preview').width, document.getElementById('preview').height]") == [32, 32]
        shoot(page, tmp_path_factory, "app-desktop-rgb")
        page.context.close()
    finally:
        server.stop()


def test_drop_and_paste_give_a_picture(browser, site_urls, digit):
    image, label = digit
    page = open_page(browser, site_urls["none"], viewport=DESKTOP)
    png = base64.b64encode(encode(image.repeat(10, 0).repeat(10, 1), "PNG")).decode()
    for how in ("drop", "paste"):
        page.click("#clear")
        wait_idle(page)
        assert page.get_attribute("[data-testid=top-class]", "data-cls") is None  # empty: no class
        before = int(page.evaluate("document.body.dataset.predictions"))
        page.evaluate(
            """([how, b64]) => {
                 const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
                 const data = new DataTransfer();
                 data.items.add(new File([bytes], 'digit.png', {type: 'image/png'}));
                 const target = document.getElementById('drop-zone');
                 if (how === 'drop') target.dispatchEvent(new DragEvent('drop', {dataTransfer: data, bubbles: true, cancelable: true}));
                 else document.dispatchEvent(new ClipboardEvent('paste', {clipboardData: data, bubbles: true}));
               }""",
            [how, png],
        )
        page.wait_for_function(f"Number(document.body.dataset.predictions) > {before}", timeout=20000)
        wait_idle(page)
        assert page.get_attribute("[data-testid=top-class]", "data-cls") == str(label), how
        np.testing.assert_array_equal(np.reshape(page.evaluate("window.modelyard.last.input"), (28, 28)), image)
    page.context.close()


def wait_offline_ready(page, version: str) -> None:
    try:
        page.wait_for_function(f"window.modelyard.ready && window.modelyard.info.version === {version!r} "
                               "&& document.body.dataset.offline === 'ready'", timeout=60000)
    except PlaywrightTimeout:
        raise AssertionError(f"not offline-ready with version {version!r} after 60 s: "
                             f"{page.evaluate(OFFLINE_STATE)}") from None


# What the page and its service workers say, for a test that waited in vain: each worker is asked
# which cache it fills (a 'cache' message with no URL caches nothing).
OFFLINE_STATE = """async () => {
  const r = await navigator.serviceWorker.getRegistration();
  const cacheOf = (w) => !w ? null : new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = (e) => resolve(`${w.state}, fills ${e.data.cached}`);
    w.postMessage({type: 'cache', urls: []}, [channel.port2]);
    setTimeout(() => resolve(`${w.state}, no answer in 5 s`), 5000);
  });
  return {
    page: {version: window.modelyard.info && window.modelyard.info.version, ready: window.modelyard.ready,
           app_cache: window.modelyard.info && window.modelyard.info.caches && window.modelyard.info.caches.app,
           offline: document.body.dataset.offline, says: document.getElementById('offline').textContent},
    controller: await cacheOf(navigator.serviceWorker.controller),
    active: await cacheOf(r && r.active), waiting: await cacheOf(r && r.waiting),
    installing: r && r.installing && r.installing.state, caches: await caches.keys(),
  };
}"""


def test_offline_reload_and_a_new_convert_on_the_next_online_load(browser, sites, demo_base, digit,
                                                                  tmp_path_factory):
    image, label = digit
    root = tmp_path_factory.mktemp("update")
    site = root / "site"
    shutil.copytree(sites["none"], site)  # the first convert, copied: this test rewrites it
    old = json.loads((site / "model.json").read_text())["version"]
    server = WebProcess(site, root)
    try:
        url = server.wait_ready()
        page = open_page(browser, url, viewport=DESKTOP)
        wait_offline_ready(page, old)
        context = page.context
        context.set_offline(True)
        assert page.evaluate("fetch('model.json', {cache: 'no-store'}).then(() => 'online', () => 'offline')") == "offline"
        page.reload()
        page.wait_for_function("window.modelyard && (window.modelyard.ready || window.modelyard.error)", timeout=30000)
        assert page.evaluate("window.modelyard.error") is None
        assert page.evaluate("navigator.serviceWorker.controller !== null")
        png = encode(image.repeat(20, 0).repeat(20, 1), "PNG")
        give_file(page, "digit.png", "image/png", png)
        assert page.get_attribute("[data-testid=top-class]", "data-cls") == str(label)
        assert page.text_content("[data-testid=top-class]") == str(label)

        # A second convert into the same folder, now with class names: the next online load has it.
        context.set_offline(False)
        names = [f"digit {k}" for k in range(10)]
        (root / "labels.txt").write_text("\n".join(names) + "\n")
        _convert(demo_base, site, "--labels", str(root / "labels.txt"))
        new = json.loads((site / "model.json").read_text())["version"]
        assert new != old
        page.reload()
        page.wait_for_function("window.modelyard && (window.modelyard.ready || window.modelyard.error)", timeout=30000)
        assert page.evaluate("window.modelyard.info.version") == new
        give_file(page, "digit.png", "image/png", png)
        assert page.text_content("[data-testid=top-class]") == f"digit {label}"
        wait_offline_ready(page, new)
        # the new worker's cache replaces the old one (deleted as the new worker activates)
        poll(lambda: (lambda k: f"modelyard-app-{new}" in k and f"modelyard-app-{old}" not in k)(
            page.evaluate("caches.keys()")), 20, "the old version's cache to go")

        # ...and offline again: the new version starts from the new cache.
        context.set_offline(True)
        page.reload()
        page.wait_for_function("window.modelyard && (window.modelyard.ready || window.modelyard.error)", timeout=30000)
        assert page.evaluate("window.modelyard.error") is None and page.evaluate("window.modelyard.info.version") == new
        give_file(page, "digit.png", "image/png", png)
        assert page.text_content("[data-testid=top-class]") == f"digit {label}"
        context.close()
    finally:
        server.stop()


class _SwCountingServer:
    """The site's server (modelyard.web.server) in this process, counting the requests for sw.js:
    the browser's update checks, which the page cannot see."""

    def __init__(self, site):
        from modelyard.web.server import make_server

        self.server = make_server(site, port=0)
        self.sw_requests = 0
        outer = self

        class Handler(self.server.RequestHandlerClass):
            def do_GET(self):  # noqa: N802
                if self.path.split("?")[0].endswith("/sw.js"):
                    with self.server.count_lock:  # one thread per request
                        outer.sw_requests += 1
                super().do_GET()

        self.server.RequestHandlerClass = Handler
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_failed_update_check_is_tried_again_while_the_page_is_newer_than_its_worker(browser, sites,
                                                                                     tmp_path_factory):
    """A newer convert is online but its sw.js is not there yet (a deploy half done): the checks the
    browser makes after the navigation fail. The page, newer than the worker that serves it, asks for
    more checks, and once sw.js is there the new worker takes over: no second load needed."""
    site = tmp_path_factory.mktemp("update-retry") / "site"
    shutil.copytree(sites["none"], site)
    version = lambda: json.loads((site / "model.json").read_text())["version"]  # noqa: E731
    server = _SwCountingServer(site)
    context = None
    try:
        page = open_page(browser, server.url, viewport=DESKTOP)
        context = page.context
        wait_offline_ready(page, version())
        shutil.copytree(sites["dynamic"], site, dirs_exist_ok=True)  # the newer convert...
        new = version()
        held = site.parent / "sw.js.held"
        (site / "sw.js").rename(held)  # ...whose sw.js is missing for now
        checks = server.sw_requests
        page.reload()
        page.wait_for_function(f"window.modelyard && window.modelyard.ready && window.modelyard.info.version === "
                               f"{new!r} && document.body.dataset.offline === 'stale'", timeout=30000)
        # The browser checks once after the navigation and the page once as it registers: a third
        # check is the page asking again because its worker is older than it.
        poll(lambda: server.sw_requests >= checks + 3, 20, "a third check of sw.js since the reload")
        held.rename(site / "sw.js")
        wait_offline_ready(page, new)
    finally:
        if context is not None:
            context.close()
        server.stop()


def installability_errors(page) -> list[str]:
    cdp = page.context.new_cdp_session(page)
    errors = cdp.send("Page.getInstallabilityErrors")["installabilityErrors"]
    cdp.detach()
    return sorted(e["errorId"] for e in errors)


def test_the_app_passes_chromiums_installability_check(browser, sites, site_urls, tmp_path):
    # A persistent profile, as a user's browser has: Playwright's other contexts are off the record,
    # where Chromium offers to install nothing ("in-incognito" whatever the site).
    context = browser.browser_type.launch_persistent_context(
        str(tmp_path / "profile"), executable_path=chromium_path(), args=CHROMIUM_FLAGS, viewport=DESKTOP)
    page = context.pages[0] if context.pages else context.new_page()
    page.goto(site_urls["none"])
    page.wait_for_function("window.modelyard && (window.modelyard.ready || window.modelyard.error)", timeout=30000)
    assert page.evaluate("window.modelyard.error") is None
    page.wait_for_function("document.body.dataset.offline === 'ready'", timeout=60000)
    page.reload()  # a second load: the service worker controls the page
    page.wait_for_function("window.modelyard && window.modelyard.ready", timeout=30000)
    assert installability_errors(page) == []
    manifest = requests.get(site_urls["none"] + "manifest.webmanifest", timeout=10)
    assert manifest.headers["Content-Type"] == "application/manifest+json"
    body = manifest.json()
    assert body["display"] == "standalone"
    assert body["name"] == "my_mnist_model (modelyard)" and body["theme_color"].startswith("#")
    for icon in body["icons"]:
        data = requests.get(site_urls["none"] + icon["src"], timeout=10).content
        side = int.from_bytes(data[16:20], "big")
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and f"{side}x{side}" == icon["sizes"]
    # The check can fail: the same page without its manifest link is not installable.
    page.route("**/bare.html", lambda route: route.fulfill(
        content_type="text/html", body=(sites["none"] / "index.html").read_text().replace('rel="manifest"', 'rel="x"')))
    page.goto(site_urls["none"] + "bare.html")
    assert installability_errors(page) != []
    context.close()


def test_web_server_revalidates_with_etags(site_urls):
    url = site_urls["none"] + "model.tflite"
    first = requests.get(url, timeout=10)
    again = requests.get(url, headers={"If-None-Match": first.headers["ETag"]}, timeout=10)
    assert again.status_code == 304 and again.content == b"" and again.headers["ETag"] == first.headers["ETag"]
    assert requests.get(url, headers={"If-None-Match": 'W/"other"'}, timeout=10).status_code == 200
