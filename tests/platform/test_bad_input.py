"""Test 5 of issue 15: bad input gets Google's error format, creates nothing, and the platform keeps
serving. Runs on its own platform process with ``--auth-token`` and one artifact root."""
from __future__ import annotations

import requests

from tests.platform.client import Api
from tests.platform.conftest import PARENT, TOKEN


def google_error(r: requests.Response, http: int, status: str) -> str:
    assert r.status_code == http, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "status"}, body
    assert body["error"]["code"] == http and body["error"]["status"] == status, body
    assert body["error"]["message"]
    return body["error"]["message"]


def test_token_is_required_on_the_control_api(guarded):
    p, _ = guarded
    url = f"{p.url}/v1/{PARENT}/models"
    assert "missing" in google_error(requests.get(url, timeout=10), 401, "UNAUTHENTICATED")
    assert "invalid" in google_error(requests.get(url, headers={"Authorization": "Bearer nope"}, timeout=10),
                                     401, "UNAUTHENTICATED")
    assert requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).status_code == 200
    google_error(requests.get(f"{p.url}/modelyard/v1/replicas", timeout=10), 401, "UNAUTHENTICATED")
    studies = f"{p.url}/v1/{PARENT}/studies"  # Vizier's routes: the same check
    google_error(requests.get(studies, timeout=10), 401, "UNAUTHENTICATED")
    google_error(requests.get(f"{p.url}/ui/{PARENT}/studies/1/operations/2", timeout=10), 401, "UNAUTHENTICATED")
    assert requests.get(studies, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).status_code == 200
    # --auth-predict: the predict routes need the token too, checked before the endpoint is looked up
    predict = f"{p.url}/v1/{PARENT}/endpoints/123456:predict"
    google_error(requests.post(predict, json={"instances": [[1, 2, 3, 4]]}, timeout=10), 401, "UNAUTHENTICATED")
    google_error(requests.post(predict, json={"instances": [[1, 2, 3, 4]]}, timeout=10,
                               headers={"Authorization": "Bearer nope"}), 401, "UNAUTHENTICATED")
    google_error(requests.post(predict, json={"instances": [[1, 2, 3, 4]]}, timeout=10,
                               headers={"Authorization": f"Bearer {TOKEN}"}), 404, "NOT_FOUND")


def test_bad_requests_get_google_errors_and_create_nothing(guarded, tiny_models):
    p, root = guarded
    api = Api(p.url, TOKEN)
    model = api.upload(tiny_models["models"]["tiny1"]["path"], "good")
    ep = api.create_endpoint("good")
    before = (api.ok("GET", "models"), api.ok("GET", f"endpoints/{ep}"))

    # Unknown ids, and ids that are not ids.
    google_error(api.call("GET", "models/123456"), 404, "NOT_FOUND")
    google_error(api.call("GET", f"models/{model}@7"), 404, "NOT_FOUND")
    google_error(api.call("DELETE", "endpoints/123456"), 404, "NOT_FOUND")
    google_error(api.predict("123456", [[1, 2, 3, 4]]), 404, "NOT_FOUND")
    google_error(api.call("GET", "models/Not_An-Id"), 400, "INVALID_ARGUMENT")  # not [a-z_][a-z0-9_-]*
    google_error(api.call("GET", "models/not-a-number"), 404, "NOT_FOUND")  # a chosen id that nobody chose
    google_error(api.call("GET", "operations/42"), 404, "NOT_FOUND")
    google_error(api.call("POST", "endpoints/123456:deployModel",
                          {"deployedModel": {"model": f"{PARENT}/models/{model}"}}), 404, "NOT_FOUND")
    google_error(api.call("POST", f"endpoints/{ep}:deployModel",
                          {"deployedModel": {"model": f"{PARENT}/models/999"}}), 404, "NOT_FOUND")
    google_error(api.call("POST", f"endpoints/{ep}:undeployModel", {"deployedModelId": "999"}), 404, "NOT_FOUND")
    google_error(api.predict(ep, [[1, 2, 3, 4]]), 400, "FAILED_PRECONDITION")  # nothing deployed

    # Traffic splits that do not sum to 100 or name unknown models.
    msg = google_error(api.call("POST", f"endpoints/{ep}:deployModel",
                                {"deployedModel": {"model": f"{PARENT}/models/{model}"}, "trafficSplit": {"0": 50}}),
                       400, "INVALID_ARGUMENT")
    assert "sum to 100" in msg
    google_error(api.call("PATCH", f"endpoints/{ep}", {"trafficSplit": {"77": 100}},
                          params={"updateMask": "trafficSplit"}), 400, "INVALID_ARGUMENT")

    # Artifacts: no SavedModel, '..', outside the roots, no URI, and malformed JSON.
    def upload(uri):
        return api.call("POST", "models:upload", {"model": {"displayName": "bad", "artifactUri": uri}})

    assert "saved_model.pb" in google_error(upload(str(root / "empty")), 400, "INVALID_ARGUMENT")
    assert "'..'" in google_error(upload(f"{root}/empty/../corrupt"), 400, "INVALID_ARGUMENT")
    assert "'..'" in google_error(upload(f"file://{root}/../etc"), 400, "INVALID_ARGUMENT")
    assert "allowed roots" in google_error(upload("/etc"), 403, "PERMISSION_DENIED")
    google_error(upload(""), 400, "INVALID_ARGUMENT")
    google_error(api.s.post(api.url("models:upload"), data=b"{not json", timeout=10), 400, "INVALID_ARGUMENT")
    google_error(api.call("POST", "models:upload", {"model": {"artifactUri": str(root / "corrupt")}}),
                 400, "INVALID_ARGUMENT")  # no display name

    # A deploy whose model cannot load fails its operation; no deployed model, no replica is left.
    corrupt = api.upload(str(root / "corrupt"), "corrupt")
    op = api.ok("POST", f"endpoints/{ep}:deployModel", {"deployedModel": {"model": f"{PARENT}/models/{corrupt}"}})
    while not op.get("done"):
        op = api.s.get(f"{p.url}/v1/{op['name']}", timeout=10).json()
    assert op["error"]["code"] == 9 and "could not load" in op["error"]["message"], op  # FAILED_PRECONDITION
    assert api.replicas() == [] and p.replica_pids() == []
    api.ok("DELETE", f"models/{corrupt}")

    assert (api.ok("GET", "models"), api.ok("GET", f"endpoints/{ep}")) == before  # nothing half-created
    assert requests.get(f"{p.url}/healthz", timeout=5).status_code == 200
