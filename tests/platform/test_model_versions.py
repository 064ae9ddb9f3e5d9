"""Issue 44, must-show 4: version aliases keep the order they were given, and the registry's fields
come back as Vertex returns them.

Google's SDK system test ``test_model_version_management`` (googleapis/python-aiplatform,
tests/system/aiplatform) is the yardstick: its steps are done here again, through the stock SDK,
against the session platform (our own code; the model is an XGBoost file trained here, and the
staging bucket is the session's: its ``--artifact-root`` limits where models come from, so the SDK's
own ``PROJECT-vertex-staging-LOCATION`` bucket is not used). Then the REST round trip of an alias
order through upload, get, list, listVersions and mergeVersionAliases (add, and ``-alias`` remove).
"""
from __future__ import annotations

import uuid

import pytest
import requests

from tests.platform.conftest import require
from tests.platform.jobs_helpers import aiplatform  # noqa: F401  (the SDK pointed at the session platform)


@pytest.fixture(scope="module")
def xgb_file(tmp_path_factory) -> str:
    """A small XGBoost model file, as Google's test downloads one (iris)."""
    xgb = require("xgboost", "pip install -e '.[test]' (installs xgboost-cpu)")
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    path = tmp_path_factory.mktemp("versions") / "my_model.bst"
    xgb.XGBClassifier(n_estimators=4, max_depth=2).fit(X, y).get_booster().save_model(str(path))
    return str(path)


def test_googles_version_management_steps(aiplatform, xgb_file):
    from google.cloud.aiplatform.models import ModelRegistry

    model_id = "my_model_id" + uuid.uuid4().hex
    version_aliases = ["system-test-model", "testing"]
    model = aiplatform.Model.upload_xgboost_model_file(model_file_path=xgb_file, version_aliases=version_aliases,
                                                       model_id=model_id, version_description="My description")
    try:
        assert model.version_description == "My description"
        # The SDK appended "default" to the caller's list (is_default_version); Vertex keeps that order.
        assert version_aliases == ["system-test-model", "testing", "default"]
        assert model.version_aliases == version_aliases

        model2 = aiplatform.Model.upload_xgboost_model_file(model_file_path=xgb_file, parent_model=model_id,
                                                            is_default_version=False)
        assert model2.version_id == "2" and model2.resource_name == model.resource_name
        assert model2.version_aliases == []

        info = model2.versioning_registry.get_version_info("testing")
        versions = model2.versioning_registry.list_versions()
        assert len(versions) == 2
        listed = versions[0]
        assert info.version_id == listed.version_id == model.version_id
        assert info.version_aliases == listed.version_aliases == model.version_aliases
        assert info.version_description == listed.version_description == model.version_description
        assert info.model_display_name == listed.model_display_name == model.display_name
        assert info.version_update_time == listed.version_update_time == model.version_update_time

        clone = model2.versioning_registry.get_model()
        assert (clone.resource_name, clone.version_id, clone.name) == (model.resource_name, model.version_id, model.name)

        registry = ModelRegistry(model)
        registry.add_version_aliases(["new-alias"], "default")
        assert registry.get_model("new-alias").version_aliases == ["system-test-model", "testing", "default", "new-alias"]
        registry.remove_version_aliases(["testing"], "new-alias")
        model = registry.get_model("new-alias")
        assert model.version_aliases == ["system-test-model", "default", "new-alias"]

        registry.delete_version("2")
        assert "2" not in [v.version_id for v in registry.list_versions()]
    finally:
        aiplatform.Model(model_id).delete()


def test_alias_order_round_trips_over_rest(platform, aiplatform, xgb_file):
    # The model file staged once by the SDK; the rest is plain REST, as any client sends it.
    staged = aiplatform.Model.upload_xgboost_model_file(model_file_path=xgb_file, display_name="staged")
    uri, image = staged.uri, staged.container_spec.image_uri
    staged.delete()
    model_id = "order_" + uuid.uuid4().hex[:8]

    def upload(aliases: list[str], **extra) -> None:
        body = {"model": {"displayName": "order", "artifactUri": uri, "containerSpec": {"imageUri": image},
                          "versionAliases": aliases}, **extra}
        r = requests.post(platform.api("models:upload"), json=body, timeout=30)
        assert r.status_code == 200, r.text

    def get(ref: str) -> list[str]:
        r = requests.get(platform.api(f"models/{model_id}@{ref}"), timeout=10)
        assert r.status_code == 200, r.text
        return r.json().get("versionAliases", [])

    def merge(ref: str, changes: list[str]) -> list[str]:
        r = requests.post(platform.api(f"models/{model_id}@{ref}:mergeVersionAliases"),
                          json={"versionAliases": changes}, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()["versionAliases"]

    upload(["zeta", "alpha", "mid"], modelId=model_id)  # no "default" given: a first version gets it, last
    assert get("1") == ["zeta", "alpha", "mid", "default"]
    upload(["b-two", "default", "a-one"], parentModel=model_id)  # "default" where the client put it
    assert get("2") == ["b-two", "default", "a-one"]
    assert get("1") == ["zeta", "alpha", "mid"]
    assert [m["versionAliases"] for m in requests.get(platform.api(f"models/{model_id}:listVersions"),
                                                         timeout=10).json()["models"]] == \
        [["zeta", "alpha", "mid"], ["b-two", "default", "a-one"]]
    listed = [m for m in requests.get(platform.api("models"), timeout=10).json()["models"]
              if m["name"].endswith(f"/models/{model_id}")]
    assert [m["versionAliases"] for m in listed] == [["b-two", "default", "a-one"]]
    # Added aliases go after the version's own, in the order given; one taken from another version leaves a gap-free list.
    assert merge("1", ["omega", "a-one", "beta"]) == ["zeta", "alpha", "mid", "omega", "a-one", "beta"]
    assert get("2") == ["b-two", "default"]
    assert merge("1", ["-alpha", "-omega"]) == ["zeta", "mid", "a-one", "beta"]
    assert get("1") == ["zeta", "mid", "a-one", "beta"]
    requests.delete(platform.api(f"models/{model_id}"), timeout=30)


def test_alias_placement_rules_keep_order():
    from modelyard.platform.api import aliases

    assert aliases.check_list(["bb", "aa", "bb"]) == ["bb", "aa"]
    placed = aliases.place({"1": ["xx", "default", "yy"], "2": ["zz"]}, "2", ["yy", "ww"], [])
    assert placed == {"1": ["xx", "default"], "2": ["zz", "yy", "ww"]}
    # an update mask's list is exactly the list given, in its order
    assert aliases.replace({"1": ["xx", "default", "yy"]}, "1", ["yy", "default", "qq"]) == {"1": ["yy", "default", "qq"]}
    assert aliases.first_version(["bb", "aa"]) == ["bb", "aa", "default"]
    assert aliases.first_version(["bb", "default", "aa"]) == ["bb", "default", "aa"]
