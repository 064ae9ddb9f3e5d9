"""What a control-plane request body may hold, as Vertex AI has it: the one place every resource's
request is checked before any of it is used or stored.

- The fields each message knows (Vertex AI v1's protos, in their JSON names: ``vertex_messages``).
  Google's JSON parser refuses any other field with ``INVALID_ARGUMENT`` "Invalid JSON payload
  received. Unknown name "x" at 'model': Cannot find field."; so does ``check_body``, at every nested
  message listed there, in lists too (``job_spec.worker_pool_specs[0].container_spec``).
  Output-only fields (``name``, ``createTime`` ...) are known fields: sent back, they are ignored.
- Display names of at most 128 characters (Vertex's documented limit for every resource);
  labels as Vertex documents them (keys and values at most 64 characters of lowercase letters,
  international ones too, digits, ``_`` and ``-``; keys start with a letter; at most 64 labels, as
  Google's label rules have it); descriptions: Vertex documents no limit, modelyard bounds them at
  ``MAX_DESCRIPTION`` characters so one request cannot grow every later listing without bound.
- The bound on a control-plane body's size (``DEFAULT_MAX_REQUEST_BYTES``, the platform's
  ``--max-request-bytes``), applied by the front server before the body is read whole; predict
  bodies have their own (``DEFAULT_MAX_PREDICT_BYTES``, ``--max-predict-bytes``), which replicas get too.
"""
from __future__ import annotations

from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.api.vertex_messages import EXTENSIONS, MESSAGES

MAX_DISPLAY_NAME = 128
MAX_DESCRIPTION = 8192
MAX_LABELS = 64
MAX_LABEL_CHARS = 64
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
# A predict body: Vertex takes 1.5 MB on a public endpoint, 10 MB on a dedicated one. A replica holds about
# ten times the JSON body while it parses it into arrays (a 185 MB body took one to 2 GB), so the
# default bounds that at ~100 MB; --max-predict-bytes raises it.
DEFAULT_MAX_PREDICT_BYTES = 10 * 1024 * 1024

# The message a job collection's create request body is.
JOB_MESSAGES = {"batchPredictionJobs": "BatchPredictionJob", "customJobs": "CustomJob",
                "hyperparameterTuningJobs": "HyperparameterTuningJob", "trainingPipelines": "TrainingPipeline"}

# Messages that carry a resource's display name, description and labels (checked by check_body).
_NAMED = {"Model", "Endpoint", "DeployedModel", "BatchPredictionJob", "CustomJob", "HyperparameterTuningJob",
          "TrainingPipeline"}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def check_body(doc: dict, message: str, at: str = "") -> None:
    """Refuses a field ``message`` does not know (at any nested message listed in ``MESSAGES``), and a
    display name, description or labels beyond Vertex's limits; ``at`` is the path Google's message
    names ('' for the request itself, else e.g. ``model``)."""
    known, nested = MESSAGES[message]
    extra = EXTENSIONS.get(message, frozenset())
    for key in doc:
        # Google's JSON parser takes a field by its JSON name or by its proto name (metricId, metric_id).
        if key not in known and key not in extra and _camel(key) not in known:
            where = f" at '{at}'" if at else ""
            raise invalid(f'Invalid JSON payload received. Unknown name "{key}"{where}: Cannot find field.')
    if message in _NAMED:
        for name, check in (("displayName", display_name), ("description", description),
                            ("versionDescription", description), ("labels", labels)):
            for spelling in (name, _snake(name)):
                if spelling in doc:
                    check(doc[spelling], f"{message}.{_snake(name)}")
    for key, inner in nested.items():
        value = doc.get(key, doc.get(_snake(key)))
        path = f"{at}.{_snake(key)}" if at else _snake(key)
        if isinstance(value, dict):
            check_body(value, inner, path)
        elif isinstance(value, list):  # a repeated message: each element, named by its index as Google does
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    check_body(item, inner, f"{path}[{i}]")


def display_name(value: object, what: str) -> None:
    """A display name, if given, is a string of at most 128 characters (its presence is the resource's rule)."""
    _bounded_text(value, what, MAX_DISPLAY_NAME, f"it can be at most {MAX_DISPLAY_NAME} characters")


def description(value: object, what: str) -> None:
    """A description, if given, is a string of at most ``MAX_DESCRIPTION`` characters (modelyard's bound)."""
    _bounded_text(value, what, MAX_DESCRIPTION, f"modelyard takes at most {MAX_DESCRIPTION}")


def _bounded_text(value: object, what: str, limit: int, why: str) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise invalid(f"{what} must be a string.")
    if len(value) > limit:
        raise invalid(f"{what} is {len(value)} characters long: {why}.")


def labels(value: object, what: str = "labels") -> dict:
    """Labels as Vertex documents them; the checked map ({} for none)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{what} must be a map of strings to strings.")
    if len(value) > MAX_LABELS:
        raise invalid(f"{what} has {len(value)} labels: a resource can have at most {MAX_LABELS}.")
    for key, val in value.items():
        ok_key = isinstance(key, str) and 0 < len(key) <= MAX_LABEL_CHARS and key[0].isalpha() \
            and key[0] == key[0].lower() and all(_label_char(c) for c in key)
        ok_value = isinstance(val, str) and len(val) <= MAX_LABEL_CHARS and all(_label_char(c) for c in val)
        if not (ok_key and ok_value):
            shown = lambda s: repr(s if not isinstance(s, str) or len(s) <= 80 else s[:80] + "...")  # noqa: E731
            raise invalid(f"Invalid label {shown(key)}: {shown(val)} in {what}: keys start with a lowercase letter; "
                          f"keys and values are at most {MAX_LABEL_CHARS} lowercase letters (international ones "
                          "too), digits, '_' and '-'.")
    return dict(value)


def _label_char(c: str) -> bool:
    return (c.isalnum() and c == c.lower()) or c in "_-"


def too_large(size: int | None, limit: int, flag: str) -> ApiError:
    """The refusal of a body over ``limit`` bytes (``size`` when declared), in Google's format (HTTP 413)."""
    declared = f" ({size} bytes)" if size is not None else ""
    return ApiError("INVALID_ARGUMENT", f"Request payload{declared} exceeds the limit of {limit} bytes "
                    f"(the platform's {flag}).", http_status=413)
