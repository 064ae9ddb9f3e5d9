"""The platform's one error type and its one mapping to Google's JSON error body.

Every failure a client can cause is raised as ``ApiError(status, message)``; the server turns it
into ``{"error": {"code": <http>, "message": ..., "status": "NOT_FOUND"}}`` in one place
(``to_body``), so the REST API, the gateway and the CLI all agree; the gateway's Open Inference
Protocol routes answer the same error as V2's ``{"error": "..."}`` (``to_v2_body``), same HTTP status.
"""
from __future__ import annotations

from modelyard.platform.api import bearer

# google.rpc.Code name -> (numeric code, HTTP status), as in googleapis' code.proto mapping.
STATUS = {
    "OK": (0, 200),
    "CANCELLED": (1, 499),
    "UNKNOWN": (2, 500),
    "INVALID_ARGUMENT": (3, 400),
    "DEADLINE_EXCEEDED": (4, 504),
    "NOT_FOUND": (5, 404),
    "ALREADY_EXISTS": (6, 409),
    "PERMISSION_DENIED": (7, 403),
    "RESOURCE_EXHAUSTED": (8, 429),
    "FAILED_PRECONDITION": (9, 400),
    "ABORTED": (10, 409),
    "UNIMPLEMENTED": (12, 501),
    "INTERNAL": (13, 500),
    "UNAVAILABLE": (14, 503),
    "UNAUTHENTICATED": (16, 401),
}


class ApiError(Exception):
    """A failure with a canonical Google status name, e.g. ``ApiError("NOT_FOUND", "Model 1 ...")``."""

    def __init__(self, status: str, message: str, http_status: int | None = None) -> None:
        if status not in STATUS:
            raise ValueError(f"unknown status {status!r}")
        super().__init__(message)
        self.status = status
        self.message = message
        self._http = http_status  # where HTTP says more than the status's own (413 for a body too large)

    @property
    def http_status(self) -> int:
        return self._http or STATUS[self.status][1]

    def to_body(self) -> dict:
        """Google's REST error body: ``code`` is the HTTP status, as Google's JSON APIs send it."""
        return {"error": {"code": self.http_status, "message": self.message, "status": self.status}}

    def to_v2_body(self) -> dict:
        """The Open Inference Protocol's (KServe V2) error body, for the gateway's /v2 routes: same status."""
        return {"error": self.message}

    def to_rpc_status(self) -> dict:
        """A ``google.rpc.Status`` (numeric code) for an Operation's ``error`` field."""
        return {"code": STATUS[self.status][0], "message": self.message}


def check_bearer(expected: str | None, header: bytes | str | None, project: str | None = None) -> None:
    """Raises the API's ``UNAUTHENTICATED`` unless ``bearer.refusal`` lets the request pass; a job's
    token passes only for a request under its own ``project`` (``PERMISSION_DENIED`` otherwise)."""
    grant = bearer.job_grant(expected, header)
    if grant is not None:
        if project != grant.project:
            raise ApiError("PERMISSION_DENIED", f"The token of job {grant.job} may call only project "
                           f"{grant.project!r}'s API" + (f", not {project!r}'s." if project else "."))
        return
    why = bearer.refusal(expected, header)
    if why == bearer.MISSING:
        raise ApiError("UNAUTHENTICATED", "Request is missing required authentication credential: "
                       "send 'Authorization: Bearer <token>' (the platform's --auth-token).")
    if why == bearer.INVALID:
        raise ApiError("UNAUTHENTICATED", "Request had invalid authentication credentials.")


def not_found(kind: str, name: str) -> ApiError:
    return ApiError("NOT_FOUND", f"{kind} {name} is not found.")


def invalid(message: str) -> ApiError:
    return ApiError("INVALID_ARGUMENT", message)
