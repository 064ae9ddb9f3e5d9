"""The storage API's one error type and its one mapping to Cloud Storage's JSON error body.

Cloud Storage answers ``{"error": {"code": 404, "message": ..., "errors": [{"message", "domain",
"reason"}]}}``; clients read ``code`` and ``errors[0].reason`` (``notFound``, ``conditionNotMet`` ...),
so every failure a request can cause is a ``StorageApiError`` turned into that body in ``to_body``.
"""
from __future__ import annotations


class StorageApiError(Exception):
    """``StorageApiError(404, "notFound", "The specified bucket does not exist.")``."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def to_body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message,
                          "errors": [{"message": self.message, "domain": "global", "reason": self.reason}]}}


def invalid(message: str) -> StorageApiError:
    return StorageApiError(400, "invalid", message)


def no_bucket(bucket: str) -> StorageApiError:
    return StorageApiError(404, "notFound", f"The specified bucket does not exist: {bucket}")


def no_object(bucket: str, name: str) -> StorageApiError:
    return StorageApiError(404, "notFound", f"No such object: {bucket}/{name}")


def precondition(message: str = "At least one of the pre-conditions you specified did not hold.") -> StorageApiError:
    return StorageApiError(412, "conditionNotMet", message)
