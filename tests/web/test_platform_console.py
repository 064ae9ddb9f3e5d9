"""The console on a real ``modelyard platform`` (with ``--auth-token``), in headless Chromium: it
shows its state only with the token, lists what the REST API says, counts what ``/metrics``
counts, escapes names, changes a traffic split and cancels a batch job only with the token, and
draws tuning curves. One platform, one endpoint, two deployed models (a split needs two) of one
tiny model, one replica each; a second platform without a token (read-only) and ``--no-console``.

Screenshots (desktop and phone) go to the session's tmp dir ``.../screenshots/platform-console-*.png``,
or to ``$MODELYARD_SCREENSHOTS``.
"""
from __future__ import annotations

import json
import os
import re
import signal

import pytest
import requests

from modelyard.web.console import platform_jobs, platform_page
from tests.platform.client import Api
from tests.platform.conftest import PARENT, TOKEN, _env, start_platform
from tests.web.conftest import DESKTOP, PHONE, poll, shoot

EVIL = "<script>alert(1)</script>"
# How many pixels of a canvas differ from the charts' background: drawn lines and labels.
INK = """(c) => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i] !== 0xf6 || d[i + 1] !== 0xf7 || d[i + 2] !== 0xfa) n++;
  return n;
}"""
# Labels follow Vertex's rule (lowercase letters, digits, _ and -), so no markup can reach the page
# through them; the page's escaping is shown with the display name (EVIL).
EVIL_LABEL = "yard_team-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def yard(tmp_path_factory, tiny_models):
    """A guarded platform with one endpoint: deployed model ``a`` takes 100% of the traffic, ``b`` 0%."""
    p = start_platform(tmp_path_factory, "console-platform", _env(),
                       ["--artifact-root", tiny_models["root"], "--auth-token", TOKEN])
    try:
        api = Api(p.url, TOKEN)
        upload = {"model": {"displayName": EVIL, "artifactUri": tiny_models["models"]["tiny1"]["path"],
                            "labels": {"team": EVIL_LABEL}}}
        model = api.wait(api.ok("POST", "models:upload", upload))["model"].rsplit("/", 1)[-1]
        endpoint = api.create_endpoint("console <b>endpoint</b>")
        # Both deployed at once (replicas start in parallel): the first to serve takes 100%, the other 0%.
        body = {"deployedModel": {"model": f"{PARENT}/models/{model}",
                                  "automaticResources": {"minReplicaCount": 1, "maxReplicaCount": 1}}}
        ops = [api.ok("POST", f"endpoints/{endpoint}:deployModel", body) for _ in range(2)]
        ids = [api.wait(op)["deployedModel"]["id"] for op in ops]
        split = api.ok("GET", f"endpoints/{endpoint}")["trafficSplit"]
        (a,), (b,) = [i for i in ids if split.get(i) == 100], [i for i in ids if i not in split]
        yield {"p": p, "api": api, "model": model, "endpoint": endpoint, "a": a, "b": b,
               "instances": tiny_models["instances"]}
    finally:
        p.cleanup()
        _kill_jobs(p.workdir)


def _kill_jobs(workdir) -> None:
    """Batch job processes this module's platform started, if a test failed before they ended."""
    marker = str(workdir / "state" / "jobs").encode()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker in f.read():
                    os.kill(int(entry), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def _open(browser, url: str, token: str | None = TOKEN, **options):
    """The console in a new browser context, the platform's token typed in (as a user does), after
    the first refresh that showed the state."""
    context = browser.new_context(**options)
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(url + "/console")
    if token is not None:
        page.fill("#token", token)
    page.wait_for_function("document.querySelector('#live #endpoints') !== null", timeout=15000)
    _after_next_poll(page)
    return page, dialogs


def _polls(page) -> int:
    return int(page.evaluate("Number(document.body.dataset.polls || 0)"))


def _after_next_poll(page) -> None:
    n = _polls(page)
    page.wait_for_function(f"Number(document.body.dataset.polls || 0) >= {n + 1}", timeout=15000)


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        m = re.fullmatch(re.escape(name) + r"\{(.*)\} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_console_shows_what_the_rest_api_says(yard, browser, tmp_path_factory):
    api, endpoint = yard["api"], yard["endpoint"]
    rest = api.ok("GET", f"endpoints/{endpoint}")
    replicas = {r["id"]: r for r in api.replicas() if r["endpointId"] == endpoint}
    model = api.ok("GET", f"models/{yard['model']}")
    assert rest["trafficSplit"] == {yard["a"]: 100} and len(replicas) == 2

    page, dialogs = _open(browser, yard["p"].url, viewport=DESKTOP)
    section = page.locator(f"section.endpoint[data-endpoint='{endpoint}']")
    assert section.locator("h3").text_content() == "console <b>endpoint</b>"
    assert section.locator(".path").text_content() == rest["name"]
    shown = {row.get_attribute("data-dm"): row.locator(".share").text_content()
             for row in section.locator("tr.dm").all()}
    assert shown == {dm["id"]: f'{rest["trafficSplit"].get(dm["id"], 0)}%' for dm in rest["deployedModels"]}
    rows = {row.get_attribute("data-replica"): [row.locator(c).text_content() for c in (".state", ".in-flight", ".served")]
            for row in section.locator("tr.replica").all()}
    assert rows == {rid: [r["state"], str(r["inFlight"]), str(r["served"])] for rid, r in replicas.items()}
    version = page.locator(f"tr.version[data-model='{yard['model']}']")
    assert version.locator(".uri").text_content() == model["artifactUri"]
    assert version.locator(".model-name").text_content() == EVIL  # the name is text, not a script
    assert version.locator(".labels").text_content() == f"team={EVIL_LABEL}" == f"team={model['labels']['team']}"
    assert page.locator("#live i").count() == 0

    # the same numbers in the JSON state, which the page is rendered from
    state = requests.get(yard["p"].url + "/console/api/state", headers=AUTH, timeout=10).json()
    ep = next(e for e in state["endpoints"] if e["id"] == endpoint)
    assert ep["trafficSplit"] == rest["trafficSplit"]
    assert {r["id"] for dm in ep["deployedModels"] for r in dm["replicas"]} == set(replicas)

    # escaping: the server sends the name escaped, the browser made no element of it and ran nothing
    answer = requests.get(yard["p"].url + "/console", headers=AUTH, timeout=10)
    html = answer.text
    assert EVIL not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    # sent compressed to a client that accepts it (requests does), plain to one that does not
    assert answer.headers["Content-Encoding"] in ("gzip", "deflate")
    assert int(answer.headers["Content-Length"]) < len(answer.content)
    plain = requests.get(yard["p"].url + "/console/api/live", headers={**AUTH, "Accept-Encoding": "identity"},
                         timeout=10)
    assert "Content-Encoding" not in plain.headers and f"data-endpoint=\"{endpoint}\"" in plain.text
    assert page.locator("#live script").count() == 0 and section.locator("h3 b").count() == 0
    _after_next_poll(page)  # after a refresh swapped the fragment in, too
    assert page.locator("#live script").count() == 0 and dialogs == []
    print("screenshot:", shoot(page, tmp_path_factory, "platform-console-desktop"))
    page.context.close()

    phone, dialogs = _open(browser, yard["p"].url, **PHONE)
    _after_next_poll(phone)
    assert phone.locator(f"section.endpoint[data-endpoint='{endpoint}'] tr.dm").count() == 2
    # nothing wider than the phone's screen: the tables' rows are stacked, every number on screen
    width = PHONE["viewport"]["width"]
    assert phone.evaluate("document.documentElement.scrollWidth") <= width
    for cell in ("tr.dm .share", "tr.dm .requests", "tr.dm .latency", "tr.replica .served", "tr.version .uri"):
        # The live fragment is swapped in on each poll: a cell measured while it is replaced has no box
        # (detached), so measure again on the next fragment rather than call that a layout failure.
        box = None
        for _ in range(20):
            box = phone.locator(cell).first.bounding_box()
            if box is not None:
                break
            phone.wait_for_timeout(100)
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (cell, box)
    print("screenshot:", shoot(phone, tmp_path_factory, "platform-console-phone"))
    assert dialogs == []
    phone.context.close()


def test_the_state_needs_the_token_the_api_needs(yard, browser):
    """With an --auth-token the API's GETs need it, and so does the console's state."""
    url = yard["p"].url
    for headers, why in (({}, "missing required authentication credential"),
                         ({"Authorization": "Bearer wrong"}, "invalid authentication credentials")):
        for path in ("/console/api/state", "/console/api/live"):
            r = requests.get(url + path, headers=headers, timeout=10)
            assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED", (path, r.text)
            assert why in r.json()["error"]["message"]
        page = requests.get(url + "/console", headers=headers, timeout=10)
        assert page.status_code == 200 and 'class="locked"' in page.text  # a shell asking for the token
        assert yard["endpoint"] not in page.text and "alert" not in page.text and yard["model"] not in page.text

    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    page.goto(url + "/console")
    _after_next_poll(page)
    assert page.locator(".locked").count() == 1 and page.locator("section.endpoint").count() == 0
    assert "missing required authentication credential" in page.locator("#updated").text_content()
    page.fill("#token", TOKEN)  # typed: the next refresh shows the state, and a reload keeps the token
    page.wait_for_function("document.querySelector('section.endpoint') !== null", timeout=15000)
    page.reload()
    page.wait_for_function("document.querySelector('section.endpoint') !== null", timeout=15000)
    context.close()


def test_request_counts_match_metrics(yard, browser):
    api, endpoint, a = yard["api"], yard["endpoint"], yard["a"]
    page, _ = _open(browser, yard["p"].url, viewport=DESKTOP)
    sent = 6
    for _ in range(sent):
        assert api.predict(endpoint, yard["instances"]).status_code == 200
    assert api.predict(endpoint, [[1.0, 2.0]]).status_code == 400  # wrong shape: the replica refuses it
    metrics = requests.get(yard["p"].url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).text
    total = _metric(metrics, "modelyard_endpoint_requests_total", endpoint=endpoint, deployed_model=a)
    ok = _metric(metrics, "modelyard_endpoint_requests_total", endpoint=endpoint, deployed_model=a, code="200")
    count = _metric(metrics, "modelyard_endpoint_request_seconds_count", endpoint=endpoint, deployed_model=a)
    assert total >= sent + 1 and total - ok >= 1

    row = page.locator(f"tr.dm[data-dm='{a}']")
    poll(lambda: row.locator(".requests").text_content() == str(int(total)), 15, "the console's request count")
    assert row.locator(".errors").text_content() == str(int(total - ok))
    assert float(row.get_attribute("data-lcount")) == count
    assert page.locator(f"tr.dm[data-dm='{yard['b']}'] .requests").text_content() == str(
        int(_metric(metrics, "modelyard_endpoint_requests_total", endpoint=endpoint, deployed_model=yard["b"])))
    # the rate cell is computed from two samples, the chart drawn: both present after a further poll
    _after_next_poll(page)
    assert re.fullmatch(r"\d+\.\d req/s", row.locator(".rate").text_content())
    assert page.locator(f"section.endpoint[data-endpoint='{endpoint}'] canvas.chart").evaluate(INK) > 200
    served = {r["id"]: r["served"] for r in api.replicas() if r["deployedModelId"] == a}
    page_served = {r.get_attribute("data-replica"): int(r.locator(".served").text_content())
                   for r in page.locator("tr.replica").all() if r.get_attribute("data-replica") in served}
    assert page_served == served
    page.context.close()


def test_update_traffic_needs_the_token(yard, browser):
    api, endpoint, a, b = yard["api"], yard["endpoint"], yard["a"], yard["b"]
    page, _ = _open(browser, yard["p"].url, viewport=DESKTOP)
    form = page.locator(f"section.endpoint[data-endpoint='{endpoint}'] form.split")
    result = form.locator(".result")
    before = api.ok("GET", f"endpoints/{endpoint}")["trafficSplit"]
    assert before == {a: 100}

    form.locator(f"input[name='{a}']").fill("30")
    form.locator(f"input[name='{b}']").fill("70")
    _after_next_poll(page)  # the typed split survives a refresh of the page's content
    assert form.locator(f"input[name='{b}']").input_value() == "70"
    assert page.locator(f"tr.dm[data-dm='{b}'] .share").text_content() == "0%"
    for given, why in (("", "missing required authentication credential"),
                       ("wrong-token", "invalid authentication credentials")):
        page.fill("#token", given)
        form.locator("button[type=submit]").click()
        poll(lambda: result.text_content().startswith("refused"), 15, "the refusal")
        assert why in result.text_content()
        assert api.ok("GET", f"endpoints/{endpoint}")["trafficSplit"] == before  # unchanged

    # a split that does not sum to 100: the API's own validation answers, the split stays
    page.fill("#token", TOKEN)
    form.locator(f"input[name='{b}']").fill("60")
    form.locator("button[type=submit]").click()
    poll(lambda: "must sum to 100" in result.text_content(), 15, "the API's validation message")
    assert api.ok("GET", f"endpoints/{endpoint}")["trafficSplit"] == before

    form.locator(f"input[name='{b}']").fill("70")
    form.locator("button[type=submit]").click()
    poll(lambda: result.text_content().startswith("updated"), 15, "the update")
    assert api.ok("GET", f"endpoints/{endpoint}")["trafficSplit"] == {a: 30, b: 70}
    poll(lambda: page.locator(f"tr.dm[data-dm='{b}'] .share").text_content() == "70%", 15, "the new split shown")
    api.set_split(endpoint, {a: 100})  # as the other tests found it
    page.context.close()


def test_read_only_without_a_token_and_off_with_no_console(tmp_path_factory, browser):
    p = start_platform(tmp_path_factory, "console-open", _env(), [])
    try:
        api = Api(p.url)
        endpoint = api.create_endpoint("open")
        page, _ = _open(browser, p.url, token=None, viewport=DESKTOP)
        assert page.locator(f"section.endpoint[data-endpoint='{endpoint}']").count() == 1
        assert page.locator(".readonly").count() == 1
        assert page.locator("#token").count() == 0 and page.locator("form.split, button.cancel").count() == 0
        page.context.close()
        # the console answers GETs only; anything else, and unknown files, in Google's error format
        for method, path in (("POST", "/console"), ("DELETE", "/console/api/state"), ("GET", "/console/x.js")):
            r = requests.request(method, p.url + path, timeout=10)
            assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND", (method, path, r.text)

        p.stop()
        p.extra_args = ["--no-console"]
        p.start()
        for method in ("GET", "POST"):
            r = requests.request(method, p.url + "/console", timeout=10)
            assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"
        assert api.ok("GET", f"endpoints/{endpoint}")["displayName"] == "open"  # the API still serves
    finally:
        p.cleanup()


def _batch_job(api: Api, yard: dict, folder, name: str, rows: int) -> str:
    assert rows % 3 == 0
    lines = "".join(json.dumps(yard["instances"][i]) + "\n" for i in range(3)) * (rows // 3)
    (folder / f"{name}.jsonl").write_text(lines)
    body = {"displayName": name, "model": f"{PARENT}/models/{yard['model']}",
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [str(folder / f"{name}.jsonl")]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": str(folder / name)}}}
    return api.ok("POST", "batchPredictionJobs", body)["name"]


def test_batch_jobs_progress_and_cancel_need_the_token(yard, browser, tmp_path, tmp_path_factory):
    api, url = yard["api"], yard["p"].url
    page, _ = _open(browser, url, viewport=DESKTOP)

    def job(name: str) -> dict:
        return api.ok("GET", name.split(f"{PARENT}/", 1)[1])

    # Both at once: the big one is cancelled (pending or running) while the small one gets done.
    small = _batch_job(api, yard, tmp_path, "small", 30)
    # Large enough to be still going when cancelled even where the C path predicts ~200k rows/s.
    big = _batch_job(api, yard, tmp_path, "big", 3_000_000)
    row = page.locator(f"tr.job[data-job='{big}']")
    result = page.locator("#jobs .result")
    poll(lambda: row.locator("button.cancel").count() == 1, 15, "the big job's Cancel button")
    page.fill("#token", "wrong-token")
    row.locator("button.cancel").click()
    poll(lambda: result.text_content().startswith("refused"), 15, "the refusal")
    assert "invalid authentication credentials" in result.text_content()
    assert job(big)["state"] in ("JOB_STATE_PENDING", "JOB_STATE_RUNNING")

    page.fill("#token", TOKEN)
    row.locator("button.cancel").click()
    poll(lambda: result.text_content().startswith("cancel requested"), 15, "the cancel")
    poll(lambda: job(big)["state"] == "JOB_STATE_CANCELLED", 60, "the job cancelled")
    poll(lambda: row.locator(".state").text_content().startswith("CANCELLED"), 15, "the console showing it")
    assert row.locator("button.cancel").count() == 0

    done = poll(lambda: (j := job(small))["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED") and j, 120,
                "the small job to finish")
    assert done["state"] == "JOB_STATE_SUCCEEDED", done
    row = page.locator(f"tr.job[data-job='{small}']")
    poll(lambda: row.locator(".state").text_content() == "SUCCEEDED", 15, "the finished job shown")
    stats = done["completionStats"]
    assert row.locator(".progress-text").text_content() == (
        f'{stats["successfulCount"]} predicted, {stats["failedCount"]} failed')
    assert row.locator("button.cancel").count() == 0  # a finished job cannot be cancelled
    print("screenshot:", shoot(page, tmp_path_factory, "platform-console-jobs-desktop"))
    page.context.close()


# Vertex Trials as the platform reports a study's (stepCount is int64: a string), in a shuffled order.
TRIALS = [{"id": str(i), "state": "SUCCEEDED",
           "finalMeasurement": {"stepCount": "3", "metrics": [{"metricId": "loss", "value": v}]},
           "measurements": [{"stepCount": str(step), "metrics": [{"metricId": "loss", "value": v + 0.2 * (3 - step)}]}
                            for step in (3, 1, 2)]}
          for i, v in ((2, 0.5), (1, 0.9), (3, 0.7), (10, 0.2))]


def test_tuning_curves_are_drawn_in_the_page(yard, browser):
    """The page's own script draws a study's curves (the fragment rendered from Vertex-shaped trials)."""
    tuning = platform_jobs.summarize("hyperparameterTuningJobs", {
        "name": f"{PARENT}/hyperparameterTuningJobs/5", "displayName": "study", "state": "JOB_STATE_RUNNING",
        "maxTrialCount": 8, "studySpec": {"metrics": [{"metricId": "loss", "goal": "MINIMIZE"}]}, "trials": TRIALS})
    html = platform_page.render_live(_state_with([tuning], can_act=False))
    page, _ = _open(browser, yard["p"].url, viewport=DESKTOP)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # swapped in and drawn in one go, between two of the page's own refreshes; pixels not background counted
    drawn = page.evaluate(f"""(html) => {{
        swapIn(html); drawCurves();
        return [...document.querySelectorAll('canvas.curve')].map((c) => [c.className, ({INK})(c)]);
      }}""", html)
    assert [name for name, _ in drawn] == ["curve", "curve learning"]
    assert all(ink > 200 for _, ink in drawn), drawn
    assert page.locator("tr.job .progress-text").text_content() == "4 of 8 trials done, best loss 0.2"
    assert errors == []
    page.context.close()


def _state_with(jobs: list[dict], can_act: bool) -> dict:
    return {"time": 0.0, "canAct": can_act, "models": [], "endpoints": [], "jobs": jobs}


def test_jobs_show_progress_curves_and_cancel_only_with_a_token():
    """Jobs as the platform's REST API lists them (Vertex AI's JSON: int64 counts as strings)."""
    parent = "projects/p/locations/l"
    batch = platform_jobs.summarize("batchPredictionJobs", {
        "name": f"{parent}/batchPredictionJobs/1", "displayName": EVIL, "state": "JOB_STATE_RUNNING",
        "completionStats": {"successfulCount": "30", "failedCount": "2", "incompleteCount": "8"}})
    assert batch["progress"] == {"done": 32, "total": 40, "text": "30 predicted, 2 failed, 8 to go"}
    assert batch["cancellable"] and batch["curve"] is None
    tuning = platform_jobs.summarize("hyperparameterTuningJobs", {
        "name": f"{parent}/hyperparameterTuningJobs/2", "displayName": "lr search", "state": "JOB_STATE_SUCCEEDED",
        "maxTrialCount": 4, "studySpec": {"metrics": [{"metricId": "loss", "goal": "MINIMIZE"}]},
        "trials": TRIALS})
    assert tuning["curve"]["values"] == [0.9, 0.5, 0.7, 0.2]  # in trial order (ids are numbers)
    assert tuning["curve"]["best"] == [0.9, 0.5, 0.5, 0.2]  # minimized
    assert tuning["progress"]["done"] == 4 and not tuning["cancellable"]
    assert tuning["curve"]["learning"][0] == pytest.approx([1.3, 1.1, 0.9])  # trial 1's measurements, in step order
    custom = platform_jobs.summarize("customJobs", {"name": f"{parent}/customJobs/3", "displayName": "train",
                                                    "state": "JOB_STATE_FAILED", "error": {"message": "<b>oom</b>"}})

    html = platform_page.render_live(_state_with([batch, tuning, custom], can_act=True))
    assert EVIL not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>oom</b>" not in html and "&lt;b&gt;oom&lt;/b&gt;" in html
    assert '<progress max="40" value="32">' in html and 'class="curve"' in html
    assert html.count('class="cancel"') == 1 and f'data-job="{parent}/batchPredictionJobs/1">Cancel' in html
    assert 'class="cancel"' not in platform_page.render_live(_state_with([batch], can_act=False))
    assert 'id="jobs"' not in platform_page.render_live(_state_with([], can_act=True))  # no jobs: no section


def test_shadow_agreement_is_shown():
    dm = {"id": "7", "displayName": "challenger", "model": "projects/p/locations/l/models/1", "modelDisplayName": "m",
          "modelVersionId": "2", "minReplicaCount": 1, "maxReplicaCount": 1, "shadowTrafficPercentage": 25,
          "replicas": [], "requests": {"total": 0, "ok": 0, "byCode": {}}, "latencySeconds": {"sum": 0.0, "count": 0},
          "shadow": {"mirrored": 40, "agreed": 36, "failed": 2, "agreementRatio": 36 / 38, "maxAbsDiff": 0.0123}}
    ep = {"name": "projects/p/locations/l/endpoints/9", "id": "9", "parent": "projects/p/locations/l",
          "displayName": "e", "labels": {}, "trafficSplit": {}, "deployedModels": [dm]}
    html = platform_page.render_live({"time": 0.0, "canAct": True, "models": [], "endpoints": [ep], "jobs": []})
    assert "shadow 25%: 36/38 agree (94.7%), 2 failed, max |diff| 0.0123" in html
    assert "form" not in html  # a shadow takes no share of the split: nothing to edit
