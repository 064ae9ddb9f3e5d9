"""Cloud Resource Manager's ``projects.get`` (v3) for the platform's projects: the SDK and Google's own tests
ask it a project's number (``resource_manager_utils.get_project_number``, the default Compute service account
``{number}-compute@developer.gserviceaccount.com``), or a number's project id.

A platform project exists as soon as a path names it (Vertex paths take any project id), so every id is
answered, with its number (``api/project_numbers``). The platform keeps no list of ids, so a number cannot
be turned back into one: an all-digits name is answered as its own id."""
from __future__ import annotations

import re

from modelyard.platform.api.errors import ApiError
from modelyard.platform.api.project_numbers import project_number

_ID = re.compile(r"[a-z][a-z0-9-]{0,62}|\d{1,30}")


def get(name: str) -> dict:
    """``projects/{id or number}`` -> Resource Manager's Project message (v3, JSON)."""
    parts = name.split("/")
    if len(parts) != 2 or parts[0] != "projects" or not parts[1]:
        raise ApiError("INVALID_ARGUMENT", f"Invalid resource name {name!r}: expected projects/{{project_id}}")
    project_id = parts[1]
    if not _ID.fullmatch(project_id):
        raise ApiError("INVALID_ARGUMENT", f"Invalid project id {project_id!r}: lowercase letters, digits and "
                       "hyphens, starting with a letter (or a project number)")
    number = project_number(project_id)
    return {"name": f"projects/{number}", "projectId": project_id, "displayName": project_id,
            "state": "ACTIVE"}
