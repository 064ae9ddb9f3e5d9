"""Bearer tokens with scopes (``--auth_token_file``), one decision for REST and gRPC.

The token file holds one token per line followed by its comma-separated scopes::

    # token                            scopes
    k3J9...predict-client-token        predict
    ops-dashboard-token-0123456789     read,metrics
    deploy-admin-token-abcdefghijkl    predict,read,admin,metrics

Scopes: ``predict`` (Predict, Classify, Regress, MultiInference), ``read`` (model status
and metadata, the console's pages), ``admin`` (HandleReloadConfigRequest, the console's
actions), ``metrics`` (the Prometheus path).
``--auth_open_metrics`` and ``--auth_open_health`` let the metrics path and model status
(the health check of load balancers) through without a token.

The file is re-read when it changes (checked at most once a second, on a request): tokens
are added and revoked without a restart; a broken edit keeps the previous tokens and is
logged. Only SHA-256 digests of the tokens are kept in memory.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from modelyard.errors import Code

log = logging.getLogger("modelyard.serving")

PREDICT, READ, ADMIN, METRICS = "predict", "read", "admin", "metrics"
SCOPES = (PREDICT, READ, ADMIN, METRICS)
OPEN = None  # the scope of a call that needs no token
MIN_TOKEN_CHARS = 16  # shorter tokens are guessable; refuse them in the file
FLAG = "--auth_token_file"
_RECHECK_S = 1.0

# REST: POST /v1/models/...:predict|classify|regress needs predict; a GET with /metadata needs
# read; any other GET under /v1/models is a status call (health).
_REST_PREDICT = re.compile(r"/v1/models/[^:]*:(predict|classify|regress)", re.I)
_REST_METADATA = re.compile(r"/v1/models/.*/metadata", re.I)
_REST_CONSOLE_ACTION = "/console/api/"  # POSTs under it change the server (reload): admin
# The Open Inference Protocol (V2): infer needs predict, the repository extension admin, health
# and readiness are health checks, metadata needs read.
_REST_V2_INFER = re.compile(r"/v2/models/.+/infer")
_REST_V2_HEALTH = re.compile(r"/v2/health/(live|ready)|/v2/models/.+/ready")
_REST_V2_REPOSITORY = "/v2/repository/"

_GRPC_SCOPES = {
    "/tensorflow.serving.PredictionService/Predict": PREDICT,
    "/tensorflow.serving.PredictionService/Classify": PREDICT,
    "/tensorflow.serving.PredictionService/Regress": PREDICT,
    "/tensorflow.serving.PredictionService/MultiInference": PREDICT,
    "/tensorflow.serving.PredictionService/GetModelMetadata": READ,
    "/tensorflow.serving.ModelService/GetModelStatus": "health",
    "/tensorflow.serving.ModelService/HandleReloadConfigRequest": ADMIN,
    "/inference.GRPCInferenceService/ModelInfer": PREDICT,
    "/inference.GRPCInferenceService/ServerLive": "health",
    "/inference.GRPCInferenceService/ServerReady": "health",
    "/inference.GRPCInferenceService/ModelReady": "health",
    "/inference.GRPCInferenceService/RepositoryModelLoad": ADMIN,
    "/inference.GRPCInferenceService/RepositoryModelUnload": ADMIN,
}


class TokenFileError(ValueError):
    """A token file that cannot be used; the message names the line."""


def parse_token_file(text: str, source: str) -> dict[bytes, frozenset[str]]:
    """Token file text -> {sha256(token): scopes}."""
    tokens: dict[bytes, frozenset[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenFileError(f"{source} line {number}: expected 'TOKEN SCOPE[,SCOPE...]'")
        token, scope_text = parts
        if len(token) < MIN_TOKEN_CHARS:
            raise TokenFileError(f"{source} line {number}: a token must have at least {MIN_TOKEN_CHARS} characters")
        scopes = frozenset(s for s in scope_text.split(",") if s)
        unknown = sorted(scopes - set(SCOPES))
        if unknown or not scopes:
            raise TokenFileError(f"{source} line {number}: unknown scope {', '.join(unknown) or '(none)'}; "
                                 f"scopes are {', '.join(SCOPES)}")
        tokens[hashlib.sha256(token.encode()).digest()] = scopes
    if not tokens:
        raise TokenFileError(f"{source} holds no token: every request would be refused")
    return tokens


@dataclass(frozen=True)
class AuthPolicy:
    """What the flags say; picklable, so worker processes build their own ``Authorizer``."""

    token_file: str
    open_metrics: bool = False
    open_health: bool = False


class Authorizer:
    """Decides one call: ``check(authorization header, scope)`` -> None (allowed) or (Code, message)."""

    def __init__(self, policy: AuthPolicy):
        self.policy = policy
        self.path = Path(policy.token_file)
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self._tokens = parse_token_file(self._read(), f"{FLAG} {self.path}")
        self._next_check = time.monotonic() + _RECHECK_S

    def _read(self) -> str:
        try:
            return self.path.read_text()
        except OSError as exc:
            raise TokenFileError(f"cannot read {FLAG} {self.path}: {exc.strerror}") from None

    def _file_stamp(self):
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        with self._lock:
            if now < self._next_check:
                return
            self._next_check = now + _RECHECK_S
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                self._tokens = parse_token_file(self._read(), f"{FLAG} {self.path}")
                log.info("Reloaded %s (%d tokens)", self.path, len(self._tokens))
            except TokenFileError as exc:
                log.error("Kept the previous tokens: %s", exc)

    # ---- which scope a call needs ---------------------------------------------------------------
    def rest_scope(self, method: str, path: str, metrics_path: str | None) -> str | None:
        if method == "OPTIONS":
            return OPEN  # CORS preflight: browsers send it without credentials
        if metrics_path and path == metrics_path:
            return OPEN if self.policy.open_metrics else METRICS
        if method == "POST" and (_REST_PREDICT.fullmatch(path) or _REST_V2_INFER.fullmatch(path)):
            return PREDICT
        if method == "POST" and path.startswith(_REST_V2_REPOSITORY) and path != _REST_V2_REPOSITORY + "index":
            return ADMIN
        if method == "GET" and _REST_V2_HEALTH.fullmatch(path):
            return OPEN if self.policy.open_health else READ
        if method == "POST" and path.startswith(_REST_CONSOLE_ACTION):
            return ADMIN
        if method == "GET" and path.lower().startswith("/v1/models/") and not _REST_METADATA.fullmatch(path):
            return OPEN if self.policy.open_health else READ
        return READ  # metadata, and anything unknown: no token, no 404 either

    def grpc_scope(self, path: str) -> str | None:
        scope = _GRPC_SCOPES.get(path, READ)
        if scope == "health":
            return OPEN if self.policy.open_health else READ
        return scope

    # ---- the decision -------------------------------------------------------------------------
    def check(self, authorization: bytes | None, scope: str | None) -> tuple[Code, str] | None:
        """None when the call may go on; else UNAUTHENTICATED or PERMISSION_DENIED and why."""
        if scope is OPEN:
            return None
        self._maybe_reload()
        if not authorization:
            return Code.UNAUTHENTICATED, "Missing bearer token: send the header 'Authorization: Bearer <token>'"
        kind, _, token = authorization.strip().partition(b" ")
        if kind.lower() != b"bearer" or not token.strip():
            return Code.UNAUTHENTICATED, "Malformed Authorization header: expected 'Bearer <token>'"
        scopes = self._tokens.get(hashlib.sha256(token.strip()).digest())
        if scopes is None:
            return Code.UNAUTHENTICATED, "Invalid bearer token"
        if scope not in scopes:
            return Code.PERMISSION_DENIED, f"This token lacks the '{scope}' scope this call needs"
        return None


_shared: dict[AuthPolicy, Authorizer] = {}
_shared_lock = threading.Lock()


def authorizer_for(policy: AuthPolicy) -> Authorizer:
    """The process's one ``Authorizer`` for ``policy``: REST and gRPC see a token file change together."""
    with _shared_lock:
        authorizer = _shared.get(policy)
        if authorizer is None:
            authorizer = _shared[policy] = Authorizer(policy)
        return authorizer
