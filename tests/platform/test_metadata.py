"""Vertex ML Metadata and the TensorBoard API one layer down (no process): the filter compiler, the
lineage queries, purge, pages, etags, schemas and TensorBoard data over a real SQLite store; and a few
requests to the session platform for what only the HTTP layer does (Google's error body, the token)."""
from __future__ import annotations

import pytest
import requests
from sqlalchemy import create_engine

from modelyard.platform.api import metadata_filter as mf
from modelyard.platform.api.errors import ApiError
from modelyard.platform.api.tracking_names import parse_tracking_path
from modelyard.platform.resources import metadata_lineage as lineage
from modelyard.platform.resources import metadata_nodes as nodes
from modelyard.platform.resources import metadata_schemas as schemas
from modelyard.platform.resources import tensorboards as tb
from modelyard.platform.state import metadata_schema
from modelyard.platform.state.metadata_db import MetadataDB
from modelyard.platform.state.tensorboard_db import TensorboardDB
from tests.platform.conftest import PARENT, TOKEN

STORE = f"{PARENT}/metadataStores/default"


def _row(**kw) -> dict:
    base = {"display_name": "", "uri": "", "state": "", "schema_title": "system.Artifact", "schema_version": "",
            "description": "", "metadata": {}, "labels": {}, "created": 100.0, "updated": 100.0, "name": "n"}
    return {**base, **kw}


def _ok(text: str, row: dict, kind: str = "artifacts", related=lambda f: set()) -> bool:
    return mf.matches(mf.parse(text, kind), row, related)


# ---- the filter compiler -----------------------------------------------------------------------------
def test_filters_on_fields_metadata_labels_and_times():
    row = _row(display_name="ds", uri="gs://b/d", schema_title="system.Dataset", state="LIVE",
               metadata={"rows": 10, "framework": "tf", "ok": True, "nested": {"k": "v"}}, labels={"team": "ml"},
               created=1700000000.0)
    assert _ok('schema_title="system.Dataset" AND uri="gs://b/d"', row)
    assert not _ok('schema_title="system.Model"', row)
    assert _ok('schema_title="system.Model" OR display_name="ds"', row)
    assert _ok("metadata.rows.number_value > 5 AND metadata.rows.number_value <= 10", row)
    assert not _ok("metadata.rows.number_value = 11", row)
    assert _ok('metadata.framework.string_value = "tf"', row)
    assert _ok('metadata.framework = "tf"', row)
    assert _ok("metadata.ok.bool_value = true", row)
    assert _ok('metadata.nested.k = "v"', row)
    assert _ok("metadata.rows:*", row) and not _ok("metadata.missing:*", row)
    assert _ok('labels.team = "ml"', row) and _ok("labels:team", row) and not _ok("labels:other", row)
    assert _ok('create_time > "2023-11-14T00:00:00Z"', row)
    assert not _ok('create_time > "2023-11-15T00:00:00Z"', row)
    assert _ok("state = LIVE", row)
    assert _ok('NOT display_name="x"', row) and _ok('-display_name="x"', row)
    # OR binds tighter than AND (AIP-160): a AND (b OR c)
    assert not _ok('display_name="x" AND display_name="ds" OR uri="gs://b/d"', row)


def test_relation_filters_in_context_and_parent_contexts():
    ctx = f"{STORE}/contexts/"
    in_ctx = lambda field: {ctx + "a"} if field == "in_context" else set()  # noqa: E731
    assert _ok(f'in_context("{ctx}a")', _row(), "artifacts", in_ctx)
    assert not _ok(f'in_context("{ctx}b")', _row(), "executions", in_ctx)
    parents = lambda field: {ctx + "p2"} if field == "parent_contexts" else set()  # noqa: E731
    assert _ok(f'parent_contexts:"{ctx}p1","{ctx}p2"', _row(), "contexts", parents)
    assert not _ok(f'parent_contexts:"{ctx}p1"', _row(), "contexts", parents)
    # The SDK's own filter strings (metadata/utils._make_filter_string).
    tree = mf.parse(f'(schema_title="system.ExperimentRun" OR schema_title="system.PipelineRun") AND '
                    f'parent_contexts:"{ctx}exp"', "contexts")
    assert mf.top_titles(tree) == {"system.ExperimentRun", "system.PipelineRun"}
    assert mf.relations_used(tree) == {"parent_contexts"}
    # An in_context() every match needs lets the store select the context's members first; under OR it cannot.
    assert mf.top_contexts(mf.parse(f'schema_title="system.Model" AND in_context("{ctx}a")', "artifacts")) \
        == {ctx + "a"}
    assert mf.top_contexts(mf.parse(f'in_context("{ctx}a") OR uri="x"', "artifacts")) is None


@pytest.mark.parametrize("text, kind, why", [
    ('nope="x"', "artifacts", "no filterable field 'nope'"),
    ('uri="x"', "contexts", "no filterable field 'uri'"),
    ('in_context("x")', "contexts", "in_context() filters artifacts and executions"),
    ('parent_contexts="x"', "contexts", 'parent_contexts takes ":"'),
    ('(display_name="x"', "artifacts", "not closed"),
    ('create_time > "yesterday"', "artifacts", "RFC 3339"),
    ('metadata.n.number_value = "ten"', "artifacts", "number_value compares with a number"),
    ("display_name", "artifacts", "needs a comparison"),
    ("((((((a=1))))))", "artifacts", "nests deeper than 5"),
])
def test_bad_filters_are_refused_with_the_reason(text, kind, why):
    with pytest.raises(ApiError) as err:
        mf.parse(text, kind)
    assert err.value.status == "INVALID_ARGUMENT" and why in err.value.message


# ---- nodes, lineage, purge, pages over a real SQLite store --------------------------------------------
@pytest.fixture
def engine(tmp_path):
    """A SQLite store with the metadata tables (test_metadata_postgres.py runs these tests on PostgreSQL)."""
    out = create_engine(f"sqlite:///{tmp_path / 'md.db'}")
    with out.begin() as conn:
        metadata_schema.create(conn)
    yield out
    out.dispose()


@pytest.fixture
def db(engine) -> MetadataDB:
    out = MetadataDB(engine)
    out.ensure_store(STORE, PARENT)
    return out


def _new(db, kind, rid, title, **body) -> dict:
    return nodes.create(db, STORE, kind, {"schemaTitle": title, **body}, rid)


def _events(db, execution, inputs=(), outputs=()):
    events = [{"artifact": f"{STORE}/artifacts/{a}", "type": "INPUT"} for a in inputs]
    events += [{"artifact": f"{STORE}/artifacts/{a}", "type": 2} for a in outputs]  # 2: OUTPUT, as ints come
    lineage.add_execution_events(db, STORE, execution, {"events": events})


def _graph(db):
    """raw -> prep -> ds -> train -> model -> deploy -> endpoint"""
    for rid, title in (("raw", "system.Dataset"), ("ds", "system.Dataset"), ("model", "system.Model"),
                       ("endpoint", "google.VertexEndpoint")):
        _new(db, "artifacts", rid, title, uri=f"gs://b/{rid}")
    for rid in ("prep", "train", "deploy"):
        _new(db, "executions", rid, "system.ContainerExecution", state="COMPLETE")
    _events(db, "prep", ["raw"], ["ds"])
    _events(db, "train", ["ds"], ["model"])
    _events(db, "deploy", ["model"], ["endpoint"])


def _ids(graph: dict, key: str) -> list[str]:
    return sorted(n["name"].rsplit("/", 1)[1] for n in graph[key])


@pytest.mark.parametrize("text", [
    'display_name:"ds*" AND labels.team="ml"',  # columns only: all in SQL
    'NOT state="LIVE" OR create_time>"2000-01-01T00:00:00Z"',
    'display_name="ds-2" OR metadata.rows.number_value>1',  # metadata under OR: all per row
    'labels:team AND metadata.rows.number_value>=1 AND -uri="gs://b/ds-0"',  # SQL for two parts, one per row
    'metadata.kind.string_value="raw" AND metadata.nested.k="v1"',  # metadata text: selected in SQL, then checked
    'metadata.kind="3" OR display_name="model"',  # a number is not the text "3"
])
def test_the_store_selects_a_filters_columns_in_sql_with_the_same_answer(db, text):
    """One grammar for every list: a metadata filter's column fields go to the store's SQL (as any list's),
    and the answer is the one the filter gives row by row."""
    for i in range(4):
        _new(db, "artifacts", f"ds-{i}", "system.Dataset", displayName=f"ds-{i}", uri=f"gs://b/ds-{i}",
             state="LIVE" if i % 2 else "PENDING", labels={"team": "ml"} if i < 3 else {},
             metadata={"rows": i, "kind": "raw" if i < 2 else i, "nested": {"k": f"v{i}"}})
    _new(db, "artifacts", "other", "system.Model", displayName="model")
    tree = mf.parse(text, "artifacts")
    by_row = sorted(r["id"] for r in db.nodes(STORE, "artifacts") if mf.matches(tree, r, lambda _f: set()))
    assert sorted(n["id"] for n in nodes.select(db, STORE, "artifacts", text)) == by_row
    sql = mf.column_part(tree)
    selected = sorted(r["id"] for r in db.nodes(STORE, "artifacts", where=sql))
    if "string_value" in text:
        assert selected == by_row == ["ds-1"]  # ds-0 and ds-1 are "raw"; ds-1's nested.k is "v1"
    assert set(by_row) <= set(selected)
    if sql is None:
        assert len(selected) == 5
    if mf.in_columns(tree):
        assert selected == by_row


def test_artifact_lineage_walks_events_both_ways_within_max_hops_and_filter(db):
    _graph(db)
    whole = lineage.artifact_lineage(db, STORE, "model", None, None)
    assert _ids(whole, "artifacts") == ["ds", "endpoint", "model", "raw"]
    assert _ids(whole, "executions") == ["deploy", "prep", "train"]
    assert len(whole["events"]) == 6
    assert _ids(lineage.artifact_lineage(db, STORE, "model", "0", None), "artifacts") == ["model"]
    two = lineage.artifact_lineage(db, STORE, "model", "2", None)
    assert _ids(two, "artifacts") == ["ds", "endpoint", "model"]
    assert _ids(two, "executions") == ["deploy", "train"]
    only_datasets = lineage.artifact_lineage(db, STORE, "model", None, 'schema_title="system.Dataset"')
    assert _ids(only_datasets, "artifacts") == ["ds", "model", "raw"]
    with pytest.raises(ApiError, match="cannot be negative"):
        lineage.artifact_lineage(db, STORE, "model", "-1", None)
    io = lineage.execution_io(db, STORE, "train")
    assert _ids(io, "artifacts") == ["ds", "model"] and _ids(io, "executions") == ["train"]
    assert sorted(e["type"] for e in io["events"]) == ["INPUT", "OUTPUT"]


def test_contexts_members_children_and_their_filters(db):
    _graph(db)
    for rid, title in (("exp", "system.Experiment"), ("run", "system.ExperimentRun"),
                       ("pipe", "system.PipelineRun")):
        _new(db, "contexts", rid, title)
    lineage.add_context_children(db, STORE, "exp", {"childContexts": [f"{STORE}/contexts/run",
                                                                     f"{STORE}/contexts/pipe"]})
    lineage.add_context_members(db, STORE, "run", {"artifacts": [f"{STORE}/artifacts/ds", f"{STORE}/artifacts/model"],
                                                   "executions": [f"{STORE}/executions/train"]})
    sub = lineage.context_lineage(db, STORE, "run")
    assert _ids(sub, "artifacts") == ["ds", "model"] and _ids(sub, "executions") == ["train"]
    assert len(sub["events"]) == 2  # only those between the context's own nodes
    listed = nodes.list_(db, STORE, "contexts", {"filter": f'parent_contexts:"{STORE}/contexts/exp" AND '
                                                           'schema_title="system.ExperimentRun"'})
    assert [c["name"] for c in listed["contexts"]] == [f"{STORE}/contexts/run"]
    assert listed["contexts"][0]["parentContexts"] == [f"{STORE}/contexts/exp"]
    in_run = nodes.list_(db, STORE, "artifacts", {"filter": f'in_context("{STORE}/contexts/run")'})
    assert _ids(in_run, "artifacts") == ["ds", "model"]
    either = nodes.list_(db, STORE, "artifacts", {"filter": f'in_context("{STORE}/contexts/run") OR uri="gs://b/raw"'})
    assert _ids(either, "artifacts") == ["ds", "model", "raw"]
    elsewhere = f"{PARENT}/metadataStores/other/contexts/run"  # the same context id in another store
    assert nodes.list_(db, STORE, "artifacts", {"filter": f'in_context("{elsewhere}")'}) == {"artifacts": []}
    with pytest.raises(ApiError, match="cycle"):
        lineage.add_context_children(db, STORE, "run", {"childContexts": [f"{STORE}/contexts/exp"]})
    # Deleted with children (no force, as the SDK's Experiment.delete sends it): they stay, parentless.
    nodes.delete(db, STORE, "contexts", "exp", force=False)
    assert "parentContexts" not in nodes.get(db, STORE, "contexts", "run")
    assert "parentContexts" not in nodes.get(db, STORE, "contexts", "pipe")
    with pytest.raises(ApiError) as err:
        lineage.add_context_members(db, STORE, "run", {"artifacts": [f"{STORE}/artifacts/nope"]})
    assert err.value.status == "NOT_FOUND"


def test_purge_pages_etags_and_schemas(db):
    for i in range(5):
        _new(db, "artifacts", f"a{i}", "system.Model", metadata={"i": i})
    dry = nodes.purge(db, STORE, "artifacts", {"filter": "metadata.i.number_value >= 2"})
    assert dry["purgeCount"] == "3" and len(nodes.select(db, STORE, "artifacts", None)) == 5
    nodes.purge(db, STORE, "artifacts", {"filter": "metadata.i.number_value >= 2", "force": True})
    assert [r["id"] for r in nodes.select(db, STORE, "artifacts", None)] == ["a0", "a1"]
    with pytest.raises(ApiError, match="filter is required"):
        nodes.purge(db, STORE, "artifacts", {"force": True})

    first = nodes.list_(db, STORE, "artifacts", {"pageSize": "1"})
    assert len(first["artifacts"]) == 1 and first["nextPageToken"]
    second = nodes.list_(db, STORE, "artifacts", {"pageSize": "1", "pageToken": first["nextPageToken"]})
    assert [a["name"] for a in second["artifacts"]] != [a["name"] for a in first["artifacts"]]
    assert "nextPageToken" not in second
    with pytest.raises(ApiError, match="same filter"):
        nodes.list_(db, STORE, "artifacts", {"pageToken": first["nextPageToken"], "filter": 'display_name="x"'})

    got = nodes.get(db, STORE, "artifacts", "a0")
    nodes.patch(db, STORE, "artifacts", "a0", {"etag": got["etag"], "displayName": "renamed"}, None, False)
    with pytest.raises(ApiError) as err:  # the etag read before that change is stale now
        nodes.patch(db, STORE, "artifacts", "a0", {"etag": got["etag"], "description": "x"}, None, False)
    assert err.value.status == "ABORTED"
    # A stale context etag in Vertex's words, which the SDK's Context.update parses (metadata/context.py's
    # _ETAG_ERROR_REGEX) to read the context again and retry: Google's test_experiments and test_custom_job
    # update a context another client changed meanwhile. (Not imported here: the SDK costs seconds to import.)
    _new(db, "contexts", "exp-etag", "system.Experiment")
    stale = nodes.get(db, STORE, "contexts", "exp-etag")["etag"]
    nodes.patch(db, STORE, "contexts", "exp-etag", {"description": "changed elsewhere"}, None, False)
    with pytest.raises(ApiError) as err:
        nodes.patch(db, STORE, "contexts", "exp-etag", {"etag": stale, "description": "x"}, None, False)
    assert err.value.status == "ABORTED"
    assert err.value.message == f"Specified Context `etag`: `{stale}` does not match server `etag`: `{int(stale) + 1}`"
    made = nodes.patch(db, STORE, "executions", "run-x", {"schemaTitle": "system.Run", "state": "RUNNING"},
                       None, allow_missing=True)
    assert made["state"] == "RUNNING"

    with pytest.raises(ApiError, match="not a schema of"):
        _new(db, "artifacts", "c1", "my.Custom")
    with pytest.raises(ApiError, match="not of ARTIFACT_TYPE"):
        _new(db, "artifacts", "c1", "system.Run")
    schemas.create(db, STORE, {"schema": "title: my.Custom\ntype: object\n", "schemaType": "ARTIFACT_TYPE",
                               "schemaVersion": "0.0.2"}, None)
    assert _new(db, "artifacts", "c1", "my.Custom")["schemaTitle"] == "my.Custom"
    assert schemas.get(db, STORE, "my-custom-v0-0-2")["schemaType"] == "ARTIFACT_TYPE"
    assert schemas.get(db, STORE, "system-dataset-v0-0-1")["schema"].startswith("title: system.Dataset")


def test_tensorboard_points_are_checked_sampled_and_deleted_with_their_run(engine):
    db = TensorboardDB(engine)
    board, name = tb.create(db, parse_tracking_path(f"{PARENT}/tensorboards"), {"displayName": "b"}, {})
    tb.create(db, parse_tracking_path(f"{name}/experiments"), {}, {"tensorboardExperimentId": "e"})
    tb.create(db, parse_tracking_path(f"{name}/experiments/e/runs"), {}, {"tensorboardRunId": "r"})
    run = parse_tracking_path(f"{name}/experiments/e/runs/r")
    series, ts_name = tb.create(db, parse_tracking_path(f"{name}/experiments/e/runs/r/timeSeries"),
                                {"displayName": "loss", "valueType": 1}, {})
    sid = ts_name.rsplit("/", 1)[1]
    points = [{"step": str(i), "wallTime": "2024-01-01T00:00:00Z", "scalar": {"value": float(i)}} for i in range(50)]
    tb.write_run(db, run, {"timeSeriesData": [{"tensorboardTimeSeriesId": sid, "valueType": "SCALAR",
                                               "values": points}]})
    read = tb.read(db, parse_tracking_path(ts_name), {"maxDataPoints": "5"})["timeSeriesData"]
    assert [p["step"] for p in read["values"]] == ["0", "13", "25", "37", "49"]
    assert tb.get(db, parse_tracking_path(ts_name))["metadata"]["maxStep"] == "49"
    with pytest.raises(ApiError, match="holds a scalar value"):
        tb.write_run(db, run, {"timeSeriesData": [{"tensorboardTimeSeriesId": sid,
                                                   "values": [{"step": "1", "tensor": {"value": ""}}]}]})
    with pytest.raises(ApiError) as err:
        tb.write_run(db, run, {"timeSeriesData": [{"tensorboardTimeSeriesId": "999", "values": []}]})
    assert err.value.status == "NOT_FOUND"
    with pytest.raises(ApiError) as err:
        tb.create(db, parse_tracking_path(f"{name}/experiments/e/runs/r/timeSeries"),
                  {"displayName": "loss", "valueType": "SCALAR"}, {})
    assert err.value.status == "ALREADY_EXISTS"
    tb.delete(db, run)
    assert db.points([sid]) == {sid: []}
    with pytest.raises(ApiError):
        tb.get(db, parse_tracking_path(ts_name))
    assert board["runCount"] == 0


# ---- what only the HTTP layer does -------------------------------------------------------------------
def test_metadata_requests_answer_googles_errors_and_need_the_token(platform, guarded):
    base = f"{platform.url}/v1/{PARENT}/metadataStores/default"
    bad = requests.get(f"{base}/artifacts", params={"filter": 'nope="x"'}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    unknown = requests.post(f"{base}/artifacts", json={"schemaTitle": "system.Artifact", "urii": "x"}, timeout=10)
    assert unknown.status_code == 400 and 'Unknown name "urii"' in unknown.json()["error"]["message"]
    missing = requests.get(f"{base}/artifacts/never-made", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
    assert requests.get(f"{platform.url}/v1/{PARENT}/metadataStores/other", timeout=10).status_code == 404

    guarded_platform, _root = guarded
    url = f"{guarded_platform.url}/v1/{PARENT}/tensorboards"
    refused = requests.get(url, timeout=10)
    assert refused.status_code == 401 and refused.json()["error"]["status"] == "UNAUTHENTICATED"
    assert requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).status_code == 200


def test_the_message_fields_are_the_sdks():
    """tracking_messages' table is Vertex AI v1's protos as the installed SDK has them: a newer field is
    noticed here rather than refused by the platform."""
    from google.cloud.aiplatform_v1 import types

    from modelyard.platform.api.tracking_messages import MESSAGES

    sdk_name = {"PurgeRequest": "PurgeArtifactsRequest"}
    for message, (known, _nested) in MESSAGES.items():
        descriptor = getattr(types, sdk_name.get(message, message)).pb().DESCRIPTOR
        assert {f.json_name for f in descriptor.fields} == set(known), message
