"""The Open Inference Protocol's model repository extension: index, load and unload models.

The repository is every model the server has been configured with (``--model_name`` or the
``--model_config_file``, and models added by a reload since). Unload takes a model out of the
served set and load puts it back (or loads a served one's versions again), both through the
server's own ``apply_configs``, the path TF Serving's ``HandleReloadConfigRequest`` takes, so
version policies, labels and ``--model_roots`` apply unchanged and other models are not touched.
Shared by ``v2_rest`` and ``v2_grpc``; the manager is read duck-typed (``core.manager``).
"""
from __future__ import annotations

import threading
from typing import Callable

from modelyard.errors import ServingError, not_found
from modelyard.serving.core import ServingCore

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
_STATES = {"AVAILABLE": READY, "START": LOADING, "LOADING": LOADING, "UNLOADING": UNLOADING, "END": UNAVAILABLE}


class Repository:
    def __init__(self, core: ServingCore, apply_configs: Callable[[list], None]):
        self.manager = core.manager
        self.apply_configs = apply_configs
        self.known: dict = {}  # name -> its last ModelConfig: what load brings back
        self.lock = threading.Lock()  # one change at a time: each reads the served set, then replaces it

    def remember(self, configs: list) -> None:
        """Every config the server applies (a start, a reload, a peer worker's change) joins the repository."""
        for config in configs:
            self.known[config.name] = config

    def _served(self) -> dict:
        served = {}
        for name in self.manager.model_names():
            config = self.manager.config_of(name)
            if config is not None:
                served[name] = self.known[name] = config
        return served

    def index(self, ready_only: bool = False) -> list[dict]:
        """Every model of the repository, one entry per version (``name``, ``version``, ``state``, ``reason``)."""
        served = self._served()
        entries = []
        for name in sorted(self.known):
            records = self.manager.version_states(name) if name in served else []
            if not records:
                reason = "no version on disk yet" if name in served else "unloaded"
                entries.append({"name": name, "version": "", "state": UNAVAILABLE, "reason": reason})
            for r in records:
                entries.append({"name": name, "version": str(r.version), "state": _STATES.get(r.state, UNAVAILABLE),
                                "reason": r.error.message if r.error else ""})
        if ready_only:
            entries = [e for e in entries if e["state"] == READY]
        return entries

    def load(self, name: str) -> None:
        """Serve ``name`` again (or load its versions again); returns once it has settled."""
        with self.lock:
            served = self._served()
            if name not in self.known:
                raise self._unknown(name)
            configs = [c for n, c in served.items() if n != name] + [self.known[name]]
            if name in served:
                self.manager.poll()  # already served: pick up versions written since
            self.apply_configs(configs)

    def unload(self, name: str) -> None:
        """Stop serving ``name`` (in-flight requests finish first); unknown names are NOT_FOUND."""
        with self.lock:
            served = self._served()
            if name not in self.known:
                raise self._unknown(name)
            if name in served:
                self.apply_configs([c for n, c in served.items() if n != name])

    def _unknown(self, name: str) -> ServingError:
        return not_found(f"model '{name}' is not in the model repository; it holds "
                         f"{', '.join(sorted(self.known)) or 'no model'}")
