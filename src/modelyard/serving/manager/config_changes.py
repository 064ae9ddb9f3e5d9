"""``--model_config_changes_file``: changes to ``--model_config_file`` appended as a journal, so one
model added to or removed from a server of a thousand models costs one line, not a re-read of them all.

Each line is one JSON object, ``{"add": NAME, "base_path": PATH}`` or ``{"remove": NAME}``, applied in
order after the config file; on a server that loads models on demand, ``{"load": NAME}`` asks it to load
that model now, ahead of its first request (``platform/dataplane/load_ahead.py`` says when). The server
reads the journal from where it stopped (a line not yet ended by its newline waits for its end); a
journal that was replaced or shortened (its writer folded it into a new config file) is read from its
start again, and so is it after the config file itself changed. Replaying a line is harmless: adding a
model already served at that path, or removing one not served, changes nothing. A bad line (not one of
these objects, or a model outside ``--model_roots``: ``admitted``) is logged and skipped, whether it is read
at the server's start or later, so it never holds back the other lines or the config file's models. A deployment resource
pool's replicas are told their models this way (``platform/dataplane/pools.py`` writes it, compacting
it into the config file once it outgrows it).
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from modelyard.errors import ServingError
from modelyard.serving.manager.manager import ModelConfig

log = logging.getLogger("modelyard.serving")


class ChangesFile:
    """Reads new lines of one journal file, remembering where it stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file read so far
        self._offset = 0

    def restart(self) -> None:
        """Read the whole journal again on the next ``read`` (the config file under it changed)."""
        self._identity, self._offset = None, 0

    def read(self) -> list[dict]:
        """The complete lines appended since the last call, parsed (a malformed line is logged and skipped)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._identity, self._offset = None, 0
            return []
        identity = (st.st_dev, st.st_ino)
        if identity != self._identity or st.st_size < self._offset:
            self._identity, self._offset = identity, 0
        if st.st_size == self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(st.st_size - self._offset)
        end = data.rfind(b"\n") + 1  # a line being written is read once its newline is there
        self._offset += end
        changes = []
        for line in data[:end].splitlines():
            change = _change(line) if line.strip() else None
            if change is not None:
                changes.append(change)
            elif line.strip():  # skipped, said once: the lines after it still apply
                log.error('%s: a line is none of {"add": NAME, "base_path": PATH}, {"remove": NAME}, '
                          '{"load": NAME}; skipped: %r', self.path, line[:200])
        return changes


def _change(line: bytes) -> dict | None:
    try:
        change = json.loads(line)
    except ValueError:
        return None
    ok = isinstance(change, dict) and (
        (isinstance(change.get("add"), str) and isinstance(change.get("base_path"), str))
        or isinstance(change.get("remove"), str) or isinstance(change.get("load"), str))
    return change if ok else None


def net_changes(changes: list[dict]) -> tuple[list[ModelConfig], list[str]]:
    """The journal's lines folded, in order: (models to serve from their base path, names to stop serving)."""
    added: dict[str, ModelConfig] = {}
    removed: dict[str, None] = {}
    for change in changes:
        if "load" in change:
            continue  # not a change of the set (loads_ahead)
        if "add" in change:
            removed.pop(change["add"], None)
            added[change["add"]] = ModelConfig(change["add"], Path(change["base_path"]))
        else:
            added.pop(change["remove"], None)
            removed[change["remove"]] = None
    return list(added.values()), list(removed)


def loads_ahead(changes: list[dict]) -> list[str]:
    """The models the lines ask to load now, ahead of their first request (on demand only), in order."""
    return list(dict.fromkeys(c["load"] for c in changes if "load" in c))


def over_config(configs: list[ModelConfig], changes: list[dict],
                check: Callable[[list[ModelConfig]], object] | None = None) -> list[ModelConfig]:
    """``configs`` (the config file's) with the whole journal ``changes`` applied on top: what a server serves
    at its start. Added models go through ``admitted`` as when the journal is polled, so one bad line is
    skipped rather than stopping the start (a refused base path is FAILED_PRECONDITION there). A model the
    config file names keeps its policy and labels when a line moves it to another base path."""
    added, removed = net_changes(changes)
    by_name = {c.name: c for c in configs}
    for name in removed:
        by_name.pop(name, None)
    for cfg in admitted(added, check):
        old = by_name.get(cfg.name)
        by_name[cfg.name] = cfg if old is None else ModelConfig(cfg.name, cfg.base_path, old.policy, old.labels)
    return list(by_name.values())


def admitted(added: list[ModelConfig], check: Callable[[list[ModelConfig]], object] | None) -> list[ModelConfig]:
    """The models of ``added`` that ``check([config])`` lets through (``--model_roots``; None: all); each refused
    one is logged with its reason and skipped, so one bad line does not hold back the others."""
    if check is None:
        return list(added)
    kept = []
    for config in added:
        try:
            check([config])
        except ServingError as exc:
            log.error("--model_config_changes_file: model %s not added: %s", config.name, exc.message)
            continue
        kept.append(config)
    return kept
