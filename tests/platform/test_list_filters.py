"""Lists as Vertex lists (issue 43, finding 10): ``filter`` (AIP-160, each resource's fields), ``orderBy``
and pages (``pageSize``/``pageToken``) on every list, applied by the store's SQL on SQLite and PostgreSQL.

One layer down, without the platform: the store's pages over rows written straight into it, on a SQLite
file and on a real PostgreSQL server (``postgres``, started once for this module). End to end, few and
cheap: the stock SDK's ``Model.list(filter=...)`` returns the one model it names (it returned every
model), ``pageSize=100`` pages over more than 100 endpoints with ``nextPageToken``, ``orderBy``, and a
bad filter is a 400 INVALID_ARGUMENT in Google's error format; operations list as well.
"""
from __future__ import annotations

import time
import uuid

import pytest

from modelyard.platform.api import list_filter as lf
from modelyard.platform.api.errors import ApiError
from modelyard.platform.state.store import Store
from tests.platform.client import Api
from tests.platform.conftest import PARENT
from tests.platform.jobs_helpers import aiplatform  # noqa: F401  (the module's SDK, pointed at the platform)
from tests.platform.test_postgres import postgres  # noqa: F401  (one PostgreSQL server for this module)

T0 = 1_700_000_000.0  # creation times of the rows written here: 1 s apart from T0


def _model(store: Store, i: int, labels: dict, name: str) -> str:
    mid = f"m{i}_{uuid.uuid4().hex[:8]}"
    store.add_model({"id": mid, "parent": PARENT, "display_name": name, "description": "", "labels": labels,
                     "created": T0 + i, "updated": T0 + i},
                    {"model_id": mid, "version_id": "1", "artifact_uri": "x", "local_path": "x", "container": {},
                     "aliases": ["default"], "created": T0 + i, "updated": T0 + i, "description": ""})
    return mid


@pytest.mark.parametrize("query, says", [
    ({"filter": 'color="red"'}, "no filterable field 'color'"),
    ({"filter": 'display_name="x" AND'}, "ends too early"),
    ({"filter": '(display_name="x"'}, "ends too early"),
    ({"filter": "display_name"}, "needs a comparison"),
    ({"filter": 'display_name<"x"'}, "takes =, !=, :"),
    ({"filter": 'create_time>"yesterday"'}, "RFC 3339"),
    ({"filter": '"x"'}, "has no field"),
    ({"orderBy": "labels"}, "order_by"),
    ({"orderBy": "display_name sideways"}, "order_by"),
    ({"pageSize": "ten"}, "whole number"),
    ({"pageSize": "-1"}, "negative"),
    ({"pageToken": "not-a-token"}, "page_token"),
])
def test_bad_requests_are_invalid_argument(query, says):
    with pytest.raises(ApiError) as exc:
        lf.list_request(query, lf.MODEL_FIELDS, lf.ORDERABLE, "Model", PARENT)
    assert exc.value.status == "INVALID_ARGUMENT" and says in exc.value.message


def test_the_cli_follows_pages(monkeypatch):
    from modelyard.platform import client_cli

    pages = {None: {"endpoints": [{"n": 1}, {"n": 2}], "nextPageToken": "t/1"}, "t/1": {"endpoints": [{"n": 3}]}}
    asked = []

    def call(self, method, path, body=None, absolute=False):
        token = path.partition("?pageToken=")[2] or None
        asked.append(path)
        return pages[token and client_cli.urllib.parse.unquote(token)]

    monkeypatch.setattr(client_cli.Client, "call", call)
    client = client_cli.Client.__new__(client_cli.Client)
    assert [e["n"] for e in client.list("endpoints", "endpoints")] == [1, 2, 3]
    assert asked == ["endpoints", "endpoints?pageToken=t%2F1"]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(request, tmp_path_factory):
    url = (f"sqlite:///{tmp_path_factory.mktemp('lists') / 'platform.db'}" if request.param == "sqlite"
           else request.getfixturevalue("postgres"))
    st = Store(url)
    ids = [_model(st, i, {"team": "a" if i < 3 else "b", **({"a key": "1"} if i == 4 else {})}, f"name{i % 2}")
           for i in range(6)]
    for i in range(5):  # jobs of two kinds, in two states
        st.add_job({"id": f"{i + 1}{uuid.uuid4().int % 10**9}", "kind": "customJobs" if i < 4 else "batchPredictionJobs",
                    "parent": PARENT, "display_name": f"job-{i}", "state": "JOB_STATE_SUCCEEDED" if i % 2 else
                    "JOB_STATE_FAILED", "spec": {}, "result": {}, "error": None, "labels": {"n": str(i)},
                    "work_dir": "/nonexistent", "pid": None, "runs": 0, "created": T0 + i, "started": None,
                    "ended": None, "updated": T0 + i})
    st.test_model_ids = ids
    yield st
    st.close()


def _models(store: Store, **query) -> tuple[list[str], str | None]:
    request = lf.list_request(query, lf.MODEL_FIELDS, lf.ORDERABLE, "Model", PARENT)
    rows, token = store.models_page(PARENT, request)
    return [r["id"] for r in rows], token


@pytest.mark.parametrize("expression, expected", [
    ('display_name="name1"', [1, 3, 5]),
    ('displayName != "name1"', [0, 2, 4]),
    ("labels.team=b", [3, 4, 5]),
    ('labels.team:"b"', [3, 4, 5]),
    ('NOT labels.team="b"', [0, 1, 2]),
    ('-labels.team="b"', [0, 1, 2]),
    ('-(labels.team="b" OR display_name="name0")', [1]),
    ('labels."a key"="1"', [4]),
    ("labels:team", [0, 1, 2, 3, 4, 5]),
    ('labels."a key":*', [4]),
    ('labels.nokey!="x"', [0, 1, 2, 3, 4, 5]),
    # AIP-160: OR binds tighter than AND
    ('display_name="name0" labels.team="b" OR labels.team="a"', [0, 2, 4]),
    ('display_name="name0" AND (labels.team="b" OR create_time<"2023-11-14T22:13:21Z")', [0, 4]),
    ('create_time>="2023-11-14T22:13:22Z" AND create_time<="2023-11-14T22:13:24+00:00"', [2, 3, 4]),
    ('create_time="2023-11-14T22:13:23.000000Z"', [3]),
    ('display_name:"nam*1"', [1, 3, 5]),
    ('display_name:"name_"', []),  # LIKE's own wildcards are plain characters in a filter
])
def test_filter_selects_in_the_store(store, expression, expected):
    ids, token = _models(store, filter=expression)
    assert ids == [store.test_model_ids[i] for i in expected] and token is None


def test_model_filter_by_id_and_order(store):
    ids, _ = _models(store, filter=f"model={store.test_model_ids[2]}")
    assert ids == [store.test_model_ids[2]]
    ids, _ = _models(store, orderBy="display_name desc, create_time desc")
    assert ids == [store.test_model_ids[i] for i in (5, 3, 1, 4, 2, 0)]


def test_pages_follow_tokens_without_repeats(store):
    seen, token, pages = [], None, 0
    while True:
        ids, token = _models(store, pageSize="4", orderBy="update_time desc", **({"pageToken": token} if token else {}))
        seen += ids
        pages += 1
        if token is None:
            break
    assert pages == 2 and seen == store.test_model_ids[::-1]
    with pytest.raises(ApiError) as exc:  # a token is bound to its filter and order
        _models(store, pageSize="4", pageToken=_models(store, pageSize="4")[1], filter='display_name="name0"')
    assert exc.value.status == "INVALID_ARGUMENT"


def test_job_lists_filter_state_and_kind(store):
    def jobs(kind: str, **query) -> list[str]:
        request = lf.list_request(query, lf.job_fields({"JOB_STATE_SUCCEEDED": "JOB_STATE_SUCCEEDED",
                                                        "JOB_STATE_FAILED": "JOB_STATE_FAILED"}),
                                  lf.ORDERABLE, "job", PARENT)
        return [r["display_name"] for r in store.jobs_page(PARENT, kind, request)[0]]

    assert jobs("customJobs", filter='state="JOB_STATE_SUCCEEDED"') == ["job-1", "job-3"]
    assert jobs("customJobs", filter='state!="JOB_STATE_SUCCEEDED" OR labels.n=1') == ["job-0", "job-1", "job-2"]
    assert jobs("customJobs", filter='display_name:"job-*" AND NOT labels.n=0', orderBy="create_time desc") == \
        ["job-3", "job-2", "job-1"]
    assert jobs("batchPredictionJobs") == ["job-4"]


# ---- end to end: the platform, the stock SDK and REST ------------------------------------------------
def test_sdk_model_list_filter_returns_the_one_it_names(platform, aiplatform, tiny_models):  # noqa: F811
    api = Api(platform.url)
    path = tiny_models["models"]["tiny1"]["path"]
    tag = uuid.uuid4().hex[:8]
    for i in range(3):
        api.upload(path, name=f"list-{tag}-{i}")
    found = aiplatform.Model.list(filter=f'display_name="list-{tag}-1"')
    assert [m.display_name for m in found] == [f"list-{tag}-1"]
    found = aiplatform.Model.list(filter=f'display_name:"list-{tag}-*"', order_by="create_time desc")
    assert [m.display_name for m in found] == [f"list-{tag}-{i}" for i in (2, 1, 0)]


def test_rest_pages_endpoints_and_refuses_a_bad_filter(platform):
    api = Api(platform.url)
    tag = uuid.uuid4().hex[:8]
    made = [api.create_endpoint(f"page-{tag}-{i:03d}") for i in range(105)]
    names, token, pages = [], None, 0
    while True:
        params = {"pageSize": 100, "filter": f'display_name:"page-{tag}-*"', "orderBy": "display_name desc"}
        body = api.ok("GET", "endpoints", params={**params, **({"pageToken": token} if token else {})})
        names += [e["displayName"] for e in body["endpoints"]]
        pages += 1
        token = body.get("nextPageToken")
        if not token:
            break
    assert pages == 2 and names == [f"page-{tag}-{i:03d}" for i in range(104, -1, -1)]
    one = api.ok("GET", "endpoints", params={"filter": f"endpoint={made[7]}"})["endpoints"]
    assert [e["displayName"] for e in one] == [f"page-{tag}-007"]
    r = api.call("GET", "endpoints", params={"filter": 'display_name="x" OR'})
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
    r = api.call("GET", "models", params={"filter": "owner=me"})
    assert r.status_code == 400 and "no filterable field 'owner'" in r.json()["error"]["message"], r.text
    r = api.call("GET", "customJobs", params={"filter": 'state="JOB_STATE_SLEEPING"'})
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
    # Operations list too: a location's (every one under it), one resource's, filtered and paged.
    ops = api.ok("GET", "operations", params={"filter": "done=true", "pageSize": 5, "orderBy": "create_time desc"})
    assert len(ops["operations"]) == 5 and ops["nextPageToken"] and all(o["done"] for o in ops["operations"])
    mine = api.ok("GET", f"endpoints/{made[3]}/operations")["operations"]
    assert [o["response"]["displayName"] for o in mine] == [f"page-{tag}-003"]
    r = api.call("GET", "operations", params={"filter": "state=done"})
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
    # A chosen id taken already: ALREADY_EXISTS, nothing written (creates are written off the event loop).
    r = api.call("POST", "endpoints", {"displayName": "again"}, params={"endpointId": made[0]})
    assert r.status_code == 409 and r.json()["error"]["status"] == "ALREADY_EXISTS", r.text
    for e in made:
        api.wait(api.ok("DELETE", f"endpoints/{e}"))
