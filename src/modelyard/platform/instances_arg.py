"""``modelyard endpoints predict --instances``: JSON text, ``@FILE`` or ``-`` (standard input) -> instances.

Every way it can go wrong is a one-line ``ValueError`` naming the value and the three forms, never a
traceback: a path given without ``@`` that exists is still read (as the flag once took), anything else
that is not JSON says so.
"""
from __future__ import annotations

import json
import os
from typing import Any, TextIO

FORMS = "give JSON text such as '[[1.0, 2.0]]' or '{\"instances\": [...]}', @FILE for a JSON file, or - for standard input"


def read_instances(value: str, stdin: TextIO) -> list[Any]:
    """The instances list ``value`` stands for."""
    if value == "-":
        where, text = "standard input", stdin.read()
    elif value.startswith("@"):
        where = value[1:]
        text = _read_file(where)
    else:
        where, text = "the value", value
        try:
            return _instances(json.loads(value), where)
        except json.JSONDecodeError as exc:
            # The flag took a bare file name before @FILE existed: an existing file is still read.
            if len(value) < 4096 and os.path.isfile(value):
                return _instances(_parse(_read_file(value), value), value)
            raise ValueError(f"--instances: {_shown(value)} is not JSON ({exc.msg} at character {exc.pos}); "
                             f"{FORMS}") from None
    return _instances(_parse(text, where), where)


def _shown(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:57] + "...")


def _read_file(path: str) -> str:
    if not path:
        raise ValueError(f"--instances @: no file name after '@'; {FORMS}")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"--instances @{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"--instances @{path}: not UTF-8 text (a JSON file was expected)") from None


def _parse(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--instances: {where} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
                         f"{FORMS}") from None


def _instances(doc: Any, where: str) -> list[Any]:
    if isinstance(doc, dict):
        if "instances" not in doc:
            raise ValueError(f"--instances: {where} is a JSON object without \"instances\"; give a list of "
                             "instances or {\"instances\": [...]}")
        doc = doc["instances"]
    if not isinstance(doc, list) or not doc:
        raise ValueError(f"--instances: {where} must hold a non-empty JSON list of instances, got "
                         f"{type(doc).__name__ if not isinstance(doc, list) else 'an empty list'}")
    return doc
