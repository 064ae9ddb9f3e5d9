"""Issue 34, must-show 2: the model registry through the stock ``google-cloud-aiplatform`` SDK.

Chosen model ids (``Model.upload(model_id=...)``), versions (``parent_model``, ``is_default_version``,
``version_aliases``, ``version_description``), ``Model.update``, and ``aiplatform.models.ModelRegistry``
end to end (list versions, version info, add / remove aliases, update and delete a version, get_model);
``@alias`` and ``@N`` where a model is named (get, deploy, batch prediction); bad inputs answered in
Google's error format. One deploy only: it shows an ``@alias`` deploy and a deployed version refused
deletion. Also: the CLI's registry commands, and a schema-v3 database upgraded in place.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import requests

from tests.platform.conftest import PARENT, STAGING_BUCKET
from tests.platform.jobs_helpers import FINAL, wait_state
from tests.platform.jobs_helpers import aiplatform  # noqa: F401  (the SDK pointed at the session platform)

MODEL_ID = "reg_model-1"


def _gs_copy(client, local: str, prefix: str) -> str:
    from pathlib import Path

    bucket = client.bucket(STAGING_BUCKET)
    for f in Path(local).rglob("*"):
        if f.is_file():
            bucket.blob(f"{prefix}/{f.relative_to(local)}").upload_from_filename(str(f))
    return f"gs://{STAGING_BUCKET}/{prefix}"


@pytest.fixture(scope="module")
def uris(tiny_models, gcs_emulator) -> dict[str, str]:
    """Each tiny model once in the bucket, so every upload below is a gs:// URI (nothing staged again)."""
    return {name: _gs_copy(gcs_emulator["client"], m["path"], f"registry/{name}")
            for name, m in tiny_models["models"].items()}


def _google_error(r: requests.Response, status: str) -> str:
    """The message of a Google-format error body with this status (and its HTTP code)."""
    from modelyard.platform.api.errors import STATUS

    body = r.json()
    assert r.status_code == STATUS[status][1], body
    assert set(body) == {"error"} and body["error"]["status"] == status and body["error"]["code"] == r.status_code
    return body["error"]["message"]


def _aliases(registry) -> dict[str, list[str]]:
    return {v.version_id: sorted(v.version_aliases) for v in registry.list_versions()}


def test_registry_with_the_stock_sdk(aiplatform, platform, uris, tiny_models, gcs_emulator):  # noqa: F811
    from google.api_core import exceptions
    from google.cloud.aiplatform.models import ModelRegistry

    upload = dict(serving_container_image_uri="modelyard/serve")
    # A chosen id, with aliases, a version description and labels on the first version.
    model = aiplatform.Model.upload(display_name="registry", artifact_uri=uris["tiny1"], model_id=MODEL_ID,
                                    version_aliases=["champion"], version_description="first cut",
                                    labels={"team": "ml"}, **upload)
    assert model.name == MODEL_ID and model.resource_name == f"{PARENT}/models/{MODEL_ID}"
    assert model.version_id == "1" and sorted(model.version_aliases) == ["champion", "default"]
    assert model.version_description == "first cut" and model.labels == {"team": "ml"}
    assert aiplatform.Model(MODEL_ID).display_name == "registry"  # GET by the chosen id
    with pytest.raises(exceptions.Conflict):  # the id is taken
        aiplatform.Model.upload(display_name="again", artifact_uri=uris["tiny1"], model_id=MODEL_ID, **upload)

    # A second version that is not the default, and a third that is.
    v2 = aiplatform.Model.upload(display_name="registry", artifact_uri=uris["tiny2"], parent_model=MODEL_ID,
                                 is_default_version=False, version_aliases=["challenger"],
                                 version_description="second cut", **upload)
    assert (v2.name, v2.version_id) == (MODEL_ID, "2") and v2.version_aliases == ["challenger"]
    assert aiplatform.Model(MODEL_ID).version_id == "1"  # "default" stayed on version 1
    v3 = aiplatform.Model.upload(display_name="registry", artifact_uri=uris["tiny1"],
                                 parent_model=model.resource_name, **upload)
    assert v3.version_id == "3" and aiplatform.Model(MODEL_ID).version_id == "3"

    registry = ModelRegistry(MODEL_ID)
    versions = registry.list_versions()
    assert [v.version_id for v in versions] == ["1", "2", "3"]
    assert {v.model_resource_name for v in versions} == {model.resource_name}
    assert _aliases(registry) == {"1": ["champion"], "2": ["challenger"], "3": ["default"]}
    assert [v.version_description for v in versions] == ["first cut", "second cut", ""]
    info = registry.get_version_info("challenger")
    assert info.version_id == "2" and info.version_description == "second cut"
    assert registry.get_model("champion").version_id == "1" and registry.get_model("2").version_id == "2"
    assert registry.get_model().version_id == "3"
    assert aiplatform.Model(f"{MODEL_ID}@1").version_id == "1"  # @N in a name the SDK takes
    assert aiplatform.Model(MODEL_ID, version="challenger").versioned_resource_name == \
        f"{PARENT}/models/{MODEL_ID}@2"

    # Aliases: an alias moves to the version it is given; "default" moves but is never just removed.
    registry.add_version_aliases(["champion", "prod"], version="2")
    assert _aliases(registry) == {"1": [], "2": ["challenger", "champion", "prod"], "3": ["default"]}
    registry.remove_version_aliases(["challenger"], version="2")
    assert _aliases(registry)["2"] == ["champion", "prod"]
    with pytest.raises(exceptions.BadRequest, match="default"):
        registry.remove_version_aliases(["default"], version="3")
    registry.add_version_aliases(["default"], version="1")
    assert _aliases(registry) == {"1": ["default"], "2": ["champion", "prod"], "3": []}
    assert aiplatform.Model(MODEL_ID).version_id == "1"

    # Model.update (the model's fields) and ModelRegistry.update_version (a version's).
    updated = aiplatform.Model(MODEL_ID).update(display_name="registry-renamed", description="all cuts",
                                                labels={"team": "ml", "tier": "gold"})
    assert (updated.display_name, updated.description) == ("registry-renamed", "all cuts")
    registry.update_version("2", version_description="the champion", labels={"stage": "beta"})
    v2 = registry.get_model("champion")
    assert v2.version_description == "the champion" and v2.display_name == "registry-renamed"
    assert v2.labels == {"team": "ml", "tier": "gold", "stage": "beta"}  # the model's and the version's
    assert aiplatform.Model(MODEL_ID).labels == {"team": "ml", "tier": "gold"}

    # Unknown aliases and versions: NOT_FOUND.
    with pytest.raises(exceptions.NotFound):
        registry.get_version_info("nope")
    with pytest.raises(exceptions.NotFound):
        aiplatform.Model(f"{MODEL_ID}@9")
    with pytest.raises(exceptions.NotFound):
        registry.add_version_aliases(["x1"], version="no-such")

    # Deleting versions: not the default one, then one that is not.
    with pytest.raises(exceptions.BadRequest, match="default"):
        registry.delete_version("1")
    registry.delete_version("3")
    assert [v.version_id for v in registry.list_versions()] == ["1", "2"]

    # Deploy by alias: version 2 (tiny2) answers; while deployed it cannot be deleted.
    endpoint = aiplatform.Endpoint.create(display_name="registry-ep")
    try:
        endpoint.deploy(aiplatform.Model(f"{MODEL_ID}@champion"), min_replica_count=1, max_replica_count=1)
        (dm,) = endpoint.list_models()
        assert dm.model == model.resource_name and dm.model_version_id == "2"
        prediction = endpoint.predict(instances=tiny_models["instances"])
        assert prediction.model_version_id == "2"
        np.testing.assert_allclose(prediction.predictions, tiny_models["models"]["tiny2"]["predictions"],
                                   rtol=1e-5, atol=1e-6)
        with pytest.raises(exceptions.BadRequest, match="deployed"):
            registry.delete_version("champion")
        deployed = [d.deployed_model_id for d in aiplatform.Model(f"{MODEL_ID}@2").gca_resource.deployed_models]
        assert deployed == [dm.id]
    finally:
        endpoint.undeploy_all()
        endpoint.delete()

    # A batch prediction job takes @alias too: it runs the version the alias names.
    bucket = gcs_emulator["client"].bucket(STAGING_BUCKET)
    bucket.blob("registry/in/rows.jsonl").upload_from_string("".join(json.dumps(r) + "\n"
                                                                      for r in tiny_models["instances"]))
    r = requests.post(platform.api("batchPredictionJobs"), timeout=30, json={
        "displayName": "registry-batch", "model": f"{PARENT}/models/{MODEL_ID}@prod",
        "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [f"gs://{STAGING_BUCKET}/registry/in/*"]}},
        "outputConfig": {"predictionsFormat": "jsonl",
                         "gcsDestination": {"outputUriPrefix": f"gs://{STAGING_BUCKET}/registry/out"}}})
    assert r.status_code == 200, r.text
    job = wait_state(platform, r.json()["name"], FINAL)
    assert job["state"] == "JOB_STATE_SUCCEEDED" and job["modelVersionId"] == "2", job
    out = job["outputInfo"]["gcsOutputDirectory"].removeprefix(f"gs://{STAGING_BUCKET}/")
    rows = [json.loads(line) for b in bucket.list_blobs(prefix=out) if "results" in b.name
            for line in b.download_as_text().splitlines()]
    np.testing.assert_allclose([row["prediction"] for row in sorted(rows, key=lambda row: tiny_models["instances"]
                                                                      .index(row["instance"]))],
                               tiny_models["models"]["tiny2"]["predictions"], rtol=1e-5, atol=1e-6)
    r = requests.post(platform.api("batchPredictionJobs"), timeout=30, json={
        "displayName": "registry-batch", "model": f"{PARENT}/models/{MODEL_ID}@nope",
        "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": ["gs://x/y.jsonl"]}},
        "outputConfig": {"gcsDestination": {"outputUriPrefix": "gs://x/out"}}})
    assert "nope" in _google_error(r, "NOT_FOUND")

    model.delete()  # every version goes
    with pytest.raises(exceptions.NotFound):
        aiplatform.Model(MODEL_ID)


def test_bad_registry_requests_in_googles_error_format(aiplatform, platform, uris):  # noqa: F811
    """Bad ids, masks and aliases: INVALID_ARGUMENT / FAILED_PRECONDITION / NOT_FOUND bodies, nothing changed."""
    from google.api_core import exceptions

    for bad in ("Upper", "1starts-with-digit", "-dash", "a" * 64, "has.dot"):
        with pytest.raises(exceptions.BadRequest, match="model_id"):
            aiplatform.Model.upload(display_name="bad", artifact_uri=uris["tiny1"], model_id=bad,
                                    serving_container_image_uri="modelyard/serve")
    ok = aiplatform.Model.upload(display_name="bad-inputs", artifact_uri=uris["tiny1"], model_id="_" + "a" * 62,
                                 serving_container_image_uri="modelyard/serve")
    model = ok.resource_name
    try:
        for path in ("models/Upper", "models/has.dot", f"{model.rsplit('/', 1)[1]}@9x"):
            r = requests.get(platform.api(path if path.startswith("models/") else f"models/{path}"), timeout=10)
            assert "Invalid model" in _google_error(r, "INVALID_ARGUMENT")
        url = f"{platform.url}/v1/{model}"
        r = requests.patch(url, params={"updateMask": "artifactUri"}, json={"artifactUri": "gs://x"}, timeout=10)
        assert "artifactUri" in _google_error(r, "INVALID_ARGUMENT")
        assert "update_mask" in _google_error(requests.patch(url, json={"displayName": "x"}, timeout=10),
                                              "INVALID_ARGUMENT")
        r = requests.patch(url, params={"updateMask": "displayName"}, json={"displayName": ""}, timeout=10)
        assert "display_name" in _google_error(r, "INVALID_ARGUMENT")
        r = requests.patch(url, params={"updateMask": "labels"}, json={"labels": {"Bad Key": "x"}}, timeout=10)
        assert "label" in _google_error(r, "INVALID_ARGUMENT")
        r = requests.patch(f"{url}@1", params={"updateMask": "displayName"}, json={"displayName": "x"}, timeout=10)
        assert "without @1" in _google_error(r, "FAILED_PRECONDITION")
        r = requests.patch(url, params={"updateMask": "versionAliases"}, json={"versionAliases": ["beta"]}, timeout=10)
        assert "default" in _google_error(r, "INVALID_ARGUMENT")  # would take "default" from its only holder
        r = requests.patch(url, params={"updateMask": "versionAliases"}, json={"versionAliases": ["default", "beta"]},
                           timeout=10)
        assert r.status_code == 200 and sorted(r.json()["versionAliases"]) == ["beta", "default"]
        for aliases, message in ((["7"], "alias"), (["Xy"], "alias"), ([], "required"), (["-"], "alias")):
            r = requests.post(f"{url}@1:mergeVersionAliases", json={"versionAliases": aliases}, timeout=10)
            assert message in _google_error(r, "INVALID_ARGUMENT")
        r = requests.post(f"{url}:mergeVersionAliases", json={"versionAliases": ["x1"]}, timeout=10)
        assert "needs a version" in _google_error(r, "INVALID_ARGUMENT")
        r = requests.delete(f"{url}@1:deleteVersion", timeout=10)
        assert "only version" in _google_error(r, "FAILED_PRECONDITION")
        r = requests.get(f"{url}:listVersions", params={"filter": "displayName=x"}, timeout=10)
        assert "filter" in _google_error(r, "INVALID_ARGUMENT")
        r = requests.post(platform.api("models:upload"), timeout=10, json={
            "parentModel": f"{PARENT}/models/no_such_model",
            "model": {"displayName": "x", "artifactUri": uris["tiny1"]}})
        assert "no_such_model" in _google_error(r, "NOT_FOUND")
        assert ok.gca_resource.version_id == aiplatform.Model(model).version_id == "1"  # nothing changed
        assert requests.get(f"{platform.url}/healthz", timeout=5).status_code == 200  # still serving
    finally:
        ok.delete()


def test_list_versions_pages_filters_and_order(aiplatform, platform, uris):  # noqa: F811
    """listVersions: names carry @N; pageSize/pageToken, a labels filter, order by create time."""
    first = aiplatform.Model.upload(display_name="pages", artifact_uri=uris["tiny1"], model_id="pages",
                                    serving_container_image_uri="modelyard/serve")
    try:
        for n in range(2):
            aiplatform.Model.upload(display_name="pages", artifact_uri=uris["tiny1"], parent_model="pages",
                                    labels={"batch": f"b{n}"}, serving_container_image_uri="modelyard/serve")
        url = f"{platform.url}/v1/{first.resource_name}:listVersions"
        page1 = requests.get(url, params={"pageSize": 2}, timeout=10).json()
        assert [m["name"].rsplit("/", 1)[1] for m in page1["models"]] == ["pages@1", "pages@2"]
        page2 = requests.get(url, params={"pageSize": 2, "pageToken": page1["nextPageToken"]}, timeout=10).json()
        assert [m["versionId"] for m in page2["models"]] == ["3"] and "nextPageToken" not in page2
        only = requests.get(url, params={"filter": 'labels.batch="b1"'}, timeout=10).json()["models"]
        assert [m["versionId"] for m in only] == ["3"]
        newest = requests.get(url, params={"orderBy": "create_time desc"}, timeout=10).json()["models"]
        assert [m["versionId"] for m in newest] == ["3", "2", "1"]
    finally:
        first.delete()


def _cli(capsys, *argv: str):
    from modelyard.platform import client_cli

    parser = argparse.ArgumentParser(prog="modelyard")
    client_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


def test_cli_model_ids_and_aliases(platform, uris, capsys):
    at = ["--platform", platform.url]
    code, up, _ = _cli(capsys, "models", "upload", *at, "--display-name", "cli-reg", "--artifact-uri", uris["tiny1"],
                       "--model-id", "cli_reg")
    assert code == 0 and up["model"].endswith("/models/cli_reg")
    code, _, _ = _cli(capsys, "models", "upload", *at, "--display-name", "cli-reg", "--artifact-uri", uris["tiny2"],
                      "--parent-model", "cli_reg", "--no-default-version", "--version-aliases", "canary")
    assert code == 0
    code, versions, _ = _cli(capsys, "models", "list-versions", *at, "cli_reg")
    assert {v["versionId"]: v["versionAliases"] for v in versions} == {"1": ["default"], "2": ["canary"]}
    code, moved, _ = _cli(capsys, "models", "aliases", *at, "cli_reg@2", "--add", "default", "--remove", "canary")
    assert code == 0 and moved["versionAliases"] == ["default"]
    assert _cli(capsys, "models", "describe", *at, "cli_reg")[1]["versionId"] == "2"
    code, _, err = _cli(capsys, "models", "describe", *at, "cli_reg@canary")
    assert code == 1 and "NOT_FOUND" in err
    code, _, err = _cli(capsys, "models", "upload", *at, "--display-name", "x", "--artifact-uri", uris["tiny1"],
                        "--model-id", "Bad")
    assert code == 1 and "INVALID_ARGUMENT" in err and "model_id" in err
    assert _cli(capsys, "models", "delete", *at, "cli_reg@1")[0] == 0  # one version
    assert [v["versionId"] for v in _cli(capsys, "models", "list-versions", *at, "cli_reg")[1]] == ["2"]
    assert _cli(capsys, "models", "delete", *at, "cli_reg")[0] == 0


def test_a_schema_v3_database_is_upgraded_in_place(tmp_path):
    """A platform.db written before the registry (schema v3: "default" implied, 32-wide ids) opens: the
    highest version of each model gets the stored "default" alias and the new columns exist."""
    from modelyard.platform.state.store import Store
    from tests.platform.v3_registry import write_v3_registry

    url = f"sqlite:///{tmp_path / 'platform.db'}"
    write_v3_registry(url)
    store = Store(url)
    try:
        assert store.migrated_from == 3
        assert store.get_version("123", None)["version_id"] == "2"
        assert [(v["version_id"], v["aliases"], v["description"]) for v in store.versions("123")] == [
            ("1", ["stable"], ""), ("2", ["default"], "")]
        assert store.get_version("123", "stable")["version_id"] == "1"
    finally:
        store.close()


def test_alias_rules_one_layer_down():
    """The placement rules the store applies (modelyard.platform.api.aliases), case by case."""
    from modelyard.platform.api import aliases
    from modelyard.platform.api.errors import ApiError

    now = {"1": ["default", "prod"], "2": ["beta"]}
    assert aliases.place(now, "2", ["prod"], []) == {"1": ["default"], "2": ["beta", "prod"]}  # prod moves
    assert aliases.place(now, "2", ["default"], ["beta"]) == {"1": ["prod"], "2": ["default"]}  # default moves
    assert aliases.place(now, "3", ["beta"], []) == {"1": ["default", "prod"], "2": [], "3": ["beta"]}  # a new version
    assert aliases.replace(now, "1", ["default", "gold"]) == {"1": ["default", "gold"], "2": ["beta"]}
    assert aliases.place(now, "2", [], ["nothing"]) == now  # removing an absent alias changes nothing
    with pytest.raises(ApiError, match="cannot be removed"):
        aliases.place(now, "1", [], ["default"])
    with pytest.raises(ApiError, match="cannot be removed"):
        aliases.replace(now, "1", ["prod"])
    assert aliases.parse_merge(["a1", "-b1", "c1", "-c1", "a1"]) == (["a1"], ["b1"])  # c1 cancels out
    assert aliases.check_list(["x1", "x1", "default"]) == ["x1", "default"]
    for bad in (["1"], ["A1"], ["a"], ["a_b"], ["a" * 129], "a1", [None]):
        with pytest.raises(ApiError):
            aliases.check_list(bad)
