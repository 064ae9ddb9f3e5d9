"""Cloud Resource Manager's ``projects.get`` (v3) for the platform's projects: the SDK and Google's own tests
ask it a project's number (``resource_manager_utils.get_project_number``, the default Compute service account
``{number}-compute@developer.gserviceaccount.com``), or a number's project id.

A platform project exists as soon as a path names it (Vertex paths take any project id), so every id is
answered. Its number is derived from the id, the same on every platform and every start (Google's are
12 digits too); a number alone names the project it is the number of only when the platform cannot know the
id (it keeps no list of ids), so an all-digits name is its own id, as a project Google made from a number."""
from __future__ import annotations

import hashlib
import re

from modelyard.platform.api.errors import ApiError

_ID = re.compile(r"[a-z][a-z0-9-]{0,62}|\d{1,30}")


def project_number(project_id: str) -> str:
    """A stable 12-digit number for ``project_id`` (digits stay as they are)."""
    if project_id.isdigit():
        return project_id
    digest = int.from_bytes(hashlib.sha256(project_id.encode()).digest()[:8], "big")
    return str(10**11 + digest % (9 * 10**11))


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
