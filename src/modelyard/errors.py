"""The one error type of modelyard's serving core, carrying a canonical status code.

Protocol adapters map the code once: REST through ``HTTP_STATUS``, gRPC through
``grpc_code()``. Names and numbers follow google.rpc.Code / tensorflow.error.Code.
"""
from __future__ import annotations

import enum
import json

# An error message may quote what the client sent, but never all of it: a 49 MB body must not
# come back as a 200 MB answer. Short values are quoted whole, exactly as TF Serving does.
QUOTE_LIMIT = 300


class Code(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# TF Serving's ToHTTPStatusCode (http_rest_api_handler), one entry per canonical code.
HTTP_STATUS: dict[Code, int] = {
    Code.OK: 200,
    Code.CANCELLED: 499,
    Code.UNKNOWN: 500,
    Code.INVALID_ARGUMENT: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.PERMISSION_DENIED: 403,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.FAILED_PRECONDITION: 400,
    Code.ABORTED: 409,
    Code.OUT_OF_RANGE: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DATA_LOSS: 500,
    Code.UNAUTHENTICATED: 401,
}


class ServingError(Exception):
    """A failure with a canonical code and a message meant for the client."""

    def __init__(self, code: Code, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def grpc_code(self):
        import grpc

        return grpc.StatusCode[self.code.name]

    def __repr__(self) -> str:
        return f"ServingError({self.code.name}, {self.message!r})"


def invalid_argument(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(Code.NOT_FOUND, message)


def failed_precondition(message: str) -> ServingError:
    return ServingError(Code.FAILED_PRECONDITION, message)


def excerpt(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` as an error message may quote it: at most ``limit`` characters, marked when cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def quote_json(value, limit: int = QUOTE_LIMIT) -> str:
    """``value`` as indented JSON for an error message, encoded only as far as the message shows it."""
    encoded, size = [], 0
    for chunk in json.JSONEncoder(indent=4, allow_nan=True).iterencode(value):
        encoded.append(chunk)
        size += len(chunk)
        if size > limit:  # stop encoding: the rest of a huge body would only be thrown away
            return "".join(encoded)[:limit] + "... (cut)"
    return "".join(encoded)
