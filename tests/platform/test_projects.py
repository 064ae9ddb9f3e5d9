"""Cloud Resource Manager's projects.get of the platform (resources/projects.py), without a process: the
number the SDK asks for a project (resource_manager_utils.get_project_number, Google's e2e_base staging
bucket), stable and Google-shaped; bad names in Google's error format."""
from __future__ import annotations

import pytest

from modelyard.platform.api.errors import ApiError
from modelyard.platform.resources import projects


def test_a_project_id_gets_a_stable_twelve_digit_number():
    answer = projects.get("projects/local")
    number = answer["name"].split("/")[1]
    assert answer["projectId"] == "local" and answer["state"] == "ACTIVE"
    assert len(number) == 12 and number.isdigit()
    assert projects.get("projects/local") == answer  # the same on every call (and every start: no state)
    assert projects.get("projects/other-project")["name"] != answer["name"]


def test_a_project_number_is_its_own_id():
    assert projects.get("projects/123456789012") == {
        "name": "projects/123456789012", "projectId": "123456789012", "displayName": "123456789012",
        "state": "ACTIVE"}


@pytest.mark.parametrize("name", ["projects/", "projects/Bad_Id", "projects/a/b", "folders/1"])
def test_bad_names_are_invalid_argument(name):
    with pytest.raises(ApiError) as err:
        projects.get(name)
    assert err.value.to_body()["error"]["status"] == "INVALID_ARGUMENT"


def test_a_bucket_made_for_a_project_carries_its_number(tmp_path):
    """Cloud Storage's bucket of ``?project=local`` has local's number, as the SDK checks before it writes a
    pipeline's artifacts there (gcs_utils._verify_bucket_ownership; else "bucket squatting" is logged)."""
    from modelyard.platform.storage.objects import Store

    store = Store(tmp_path / "root")
    number = projects.get("projects/local")["name"].split("/")[1]
    assert store.create_bucket({"name": "owned"}, "local")["projectNumber"] == number
    store.patch_bucket("owned", {"labels": {"a": "b"}})
    assert store.bucket_resource("owned")["projectNumber"] == number
    assert store.create_bucket({"name": "nobodys"})["projectNumber"] == "0"
