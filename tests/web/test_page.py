"""The digits page in headless Chromium: LiteRT.js's answers equal Python LiteRT's, drawing works,
the server toggle compares, every quantization mode runs, phone and desktop layouts."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import requests

from modelyard.datasets import load_digits_28
from tests.web.conftest import PHONE, DESKTOP, open_page, shoot, wait_idle

N_DIGITS = 20


def python_litert(site, images: np.ndarray) -> np.ndarray:
    """The site's model.tflite run by Python LiteRT, dequantized like the page does."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(site / "model.tflite"))
    interpreter.allocate_tensors()
    (inp,), out = interpreter.get_input_details(), interpreter.get_output_details()[0]
    rows = []
    for image in images:
        interpreter.set_tensor(inp["index"], image[None].astype(inp["dtype"]))
        interpreter.invoke()
        value = interpreter.get_tensor(out["index"])[0].astype(np.float64)
        scale, zero = out["quantization"]
        rows.append((value - zero) * scale if scale else value)
    return np.array(rows)


def page_predictions(page, images: np.ndarray) -> np.ndarray:
    values = page.evaluate(
        """async (images) => {
             const out = [];
             for (const image of images) out.push((await window.modelyard.predict(image)).values);
             return out;
           }""",
        images.reshape(len(images), -1).tolist(),
    )
    return np.array(values)


@pytest.fixture(scope="module")
def test_digits():
    images, labels = load_digits_28("test")
    return images[:N_DIGITS], labels[:N_DIGITS]


def test_float_page_equals_python_litert(browser, sites, site_urls, test_digits):
    from ai_edge_litert.interpreter import Interpreter

    images, labels = test_digits
    detail = Interpreter(model_path=str(sites["none"] / "model.tflite")).get_input_details()[0]
    assert list(detail["shape_signature"]) == [1, 28, 28]  # batch fixed: LiteRT.js refuses -1
    page = open_page(browser, site_urls["none"])
    in_page = page_predictions(page, images)
    expected = python_litert(sites["none"], images)
    assert in_page.shape == (N_DIGITS, 10)
    np.testing.assert_allclose(in_page, expected, rtol=0, atol=1e-5)
    assert (in_page.argmax(1) == labels).mean() >= 0.9  # the model really classifies
    page.context.close()


def test_int8_page_top1_agrees_with_python_litert(browser, sites, site_urls, test_digits):
    images, _ = test_digits
    info = json.loads((sites["int8"] / "model.json").read_text())
    assert info["outputs"][0]["dtype"] == "uint8" and info["outputs"][0]["scale"] > 0
    page = open_page(browser, site_urls["int8"])
    in_page = page_predictions(page, images)
    expected = python_litert(sites["int8"], images)
    assert list(in_page.argmax(1)) == list(expected.argmax(1))
    page.context.close()


# Strokes in pad fractions (0..1); each shape is drawn as a person would, one stroke per list.
SHAPES = {
    1: [[(0.5, 0.12), (0.5, 0.88)]],
    0: [[(0.5 + 0.25 * math.sin(2 * math.pi * k / 24), 0.5 - 0.38 * math.cos(2 * math.pi * k / 24))
         for k in range(25)]],
    7: [[(0.22, 0.15), (0.78, 0.15), (0.42, 0.88)]],
}


def draw(page, strokes) -> None:
    box = page.locator("#pad").bounding_box()
    for stroke in strokes:
        points = [(box["x"] + x * box["width"], box["y"] + y * box["height"]) for x, y in stroke]
        page.mouse.move(*points[0])
        page.mouse.down()
        for point in points[1:]:
            page.mouse.move(*point, steps=3)
        page.mouse.up()
    wait_idle(page)


@pytest.fixture(scope="module")
def drawing_page(browser, site_urls):
    page = open_page(browser, site_urls["none"], viewport=DESKTOP)
    yield page
    page.context.close()


@pytest.mark.parametrize("digit", sorted(SHAPES))
def test_drawn_digit_is_recognised(drawing_page, digit):
    page = drawing_page
    page.click("#clear")
    wait_idle(page)
    assert max(page.evaluate("window.modelyard.last.input")) == 0  # cleared: a blank input
    draw(page, SHAPES[digit])
    top = page.locator("#top").get_attribute("data-cls")
    assert top == str(digit), f"drew a {digit}, the page says {top}: {page.evaluate('window.modelyard.last.page.values')}"
    # the input the model saw is a digits-style 28x28 image with ink in it
    assert max(page.evaluate("window.modelyard.last.input")) == 255


def test_a_blank_pad_shows_no_class(drawing_page):
    """Issue 27: the page said "top class 3" before anything was drawn (the model's answer for a blank image)."""
    page = drawing_page
    for _ in range(2):  # as loaded (or after the digit tests), then cleared after a drawing
        page.click("#clear")
        wait_idle(page)
        assert page.locator("#top").get_attribute("data-cls") is None
        assert page.text_content("#top").startswith("–")
        assert page.locator(".bar").count() == 0  # no bars either
        draw(page, SHAPES[1])
        assert page.locator("#top").get_attribute("data-cls") == "1"


def test_toggle_compares_with_modelyard_serve(browser, site_urls, demo_server, tmp_path_factory):
    model_url = f"{demo_server.base}/v1/models/my_mnist_model"
    page = open_page(browser, f"{site_urls['none']}?serve={model_url}", viewport=DESKTOP)
    assert page.locator("#compare").is_checked()
    draw(page, SHAPES[7])
    last = page.evaluate("window.modelyard.last")
    assert last["server"] is not None, page.text_content("#server-note")
    # the same input through the server's REST API: what the page shows is what the server says
    direct = requests.post(model_url + ":predict", json={"instances": [np.reshape(last["input"], (28, 28)).tolist()]})
    np.testing.assert_allclose(last["server"]["values"], direct.json()["predictions"][0], atol=1e-6)
    np.testing.assert_allclose(last["page"]["values"], last["server"]["values"], atol=1e-5)
    assert page.text_content("#server-ms").endswith(" ms") and page.text_content("#page-ms").endswith(" ms")
    assert page.locator(".fill.server").count() == 5  # the top five, both sides
    shoot(page, tmp_path_factory, "digits-desktop")
    page.context.close()


@pytest.mark.parametrize("mode", ["dynamic", "float16", "int8"])
def test_quantized_sites_show_size_and_latency(browser, sites, site_urls, mode):
    page = open_page(browser, site_urls[mode])
    size = (sites[mode] / "model.tflite").stat().st_size
    facts = page.text_content("#model-facts")
    assert facts.startswith(f"{mode}, {size / 1024:.1f} KiB")
    assert size < (sites["none"] / "model.tflite").stat().st_size
    assert page.text_content("#page-ms").endswith(" ms")
    page.context.close()


def test_phone_viewport_draws_with_a_finger(browser, site_urls, tmp_path_factory):
    page = open_page(browser, site_urls["none"], **PHONE)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "horizontal scroll on a phone"
    box = page.locator("#pad").bounding_box()
    assert box["width"] >= 250 and box["x"] + box["width"] <= PHONE["viewport"]["width"]
    # a finger stroke: touch events through the DevTools protocol (Playwright's API only taps)
    cdp = page.context.new_cdp_session(page)
    x = box["x"] + box["width"] / 2
    ys = [box["y"] + box["height"] * f for f in np.linspace(0.12, 0.88, 12)]
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": x, "y": ys[0]}]})
    for y in ys[1:]:
        cdp.send("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": [{"x": x, "y": y}]})
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
    wait_idle(page)
    assert page.locator("#top").get_attribute("data-cls") == "1"
    shoot(page, tmp_path_factory, "digits-phone")
    page.context.close()


def test_web_server_headers_gzip_and_one_wasm_variant(browser, site_urls):
    base = site_urls["none"]
    wasm = requests.get(base + "runtime/litertjs/wasm/litert_wasm_internal.wasm", headers={"Accept-Encoding": "gzip"},
                        stream=True)
    assert wasm.headers["Content-Type"] == "application/wasm"
    assert wasm.headers["Content-Encoding"] == "gzip"
    assert wasm.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert wasm.headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert int(wasm.headers["Content-Length"]) < 4_000_000
    wasm.close()
    assert requests.get(base + "../../etc/passwd").status_code == 404
    assert requests.get(base + "%2e%2e/%2e%2e/etc/passwd").status_code == 404

    context = browser.new_context()
    page = context.new_page()
    requested, finished = [], {}
    page.on("request", lambda r: requested.append(r))
    page.on("requestfinished", lambda r: finished.__setitem__(id(r), r.sizes()["responseBodySize"]))
    page.goto(base)
    page.wait_for_function("window.modelyard && window.modelyard.ready", timeout=30000)
    # Every request was made before the page was ready, but Playwright may hand over a request's
    # "finished" event after the page's own answer (a streamed wasm compile ends its fetch late):
    # wait for each request's end rather than reading the list the moment the page is ready.
    for _ in range(100):
        if all(id(r) in finished for r in requested):
            break
        page.wait_for_timeout(100)
    unfinished = [r.url for r in requested if id(r) not in finished]
    assert not unfinished, f"requests that never finished: {unfinished}"
    wasm_files = [r.url for r in requested if r.url.endswith(".wasm")]
    assert len(wasm_files) == 1, wasm_files
    assert sum(finished.values()) <= 4_000_000
    context.close()


def test_unreachable_server_is_reported_in_the_page(browser, site_urls):
    page = open_page(browser, f"{site_urls['none']}?serve=http://127.0.0.1:9/v1/models/my_mnist_model",
                     viewport=DESKTOP)
    draw(page, SHAPES[1])
    assert page.text_content("#server-ms") == "error"
    assert "modelyard serve" in page.text_content("#server-note")
    assert page.locator("#top").get_attribute("data-cls") == "1"  # the page itself still predicts
    page.context.close()
