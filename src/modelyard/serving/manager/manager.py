"""The model manager: every model's versions, their states, labels, and availability-preserving swaps.

States follow TF Serving: START -> LOADING -> AVAILABLE -> UNLOADING -> END; a failed load
ends in END with its error kept for status. Requests read an immutable snapshot of the
available versions, so loading and unloading never block them. A version stays loaded
until a newer aspired version is AVAILABLE, so a failed or slow load never drops traffic.

With ``on_demand`` (``on_demand.OnDemand``: ``--load_models_on_demand``) a configured model is not
*resident* until its first request: ``acquire`` then asks the policy to make room and load it, and
``evict`` unloads a model no request holds.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from modelyard.errors import Code, ServingError
from modelyard.model.runtime.servable import Servable
from modelyard.serving.manager.versions import VersionPolicy, fingerprint, version_dirs

log = logging.getLogger("modelyard.serving")

START, LOADING, AVAILABLE, UNLOADING, END = "START", "LOADING", "AVAILABLE", "UNLOADING", "END"


@dataclass(frozen=True)
class ModelConfig:
    name: str
    base_path: Path | str  # a gs:// base path stays a URI: versions.version_dirs reads its mirror
    policy: VersionPolicy = VersionPolicy()
    labels: dict[str, int] = field(default_factory=dict)


class VersionRecord:
    """One version's lifecycle. ``inflight`` counts requests using the servable right now."""

    def __init__(self, version: int, path: Path):
        self.version = version
        self.path = path
        self.state = START
        self.error: ServingError | None = None
        self.servable: Servable | None = None
        self.fingerprint: tuple = ()
        self.inflight = 0
        self.idle = threading.Condition()


class Handle:
    """A request's hold on one available version; unloading waits until every handle is released."""

    __slots__ = ("record", "model_name")

    def __init__(self, model_name: str, record: VersionRecord):
        self.model_name = model_name
        self.record = record

    @property
    def servable(self) -> Servable:
        return self.record.servable

    @property
    def version(self) -> int:
        return self.record.version

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc) -> None:
        rec = self.record
        with rec.idle:
            rec.inflight -= 1
            if rec.inflight == 0:
                rec.idle.notify_all()


_NOTHING_AVAILABLE: tuple = (None, {}, False)


class ModelState:
    def __init__(self, config: ModelConfig):
        self.config = config
        self.records: dict[int, VersionRecord] = {}
        # Snapshot read by requests without locking: (latest available version, {version: record},
        # whether every one of them runs inline).
        self.available: tuple[int | None, dict[int, VersionRecord], bool] = _NOTHING_AVAILABLE
        self.removed = False
        self.resident = True  # on demand: False until a request asks for it, and again once evicted
        self.used = 0.0  # on demand: when a request last took it (time.monotonic)
        self.requests = 0  # on demand: requests that took it (the platform's load-ahead rates read it)


LoadFn = Callable[[str, int, Path], Servable]


class Manager:
    def __init__(self, load: LoadFn, load_threads: int = 2, unload_timeout_s: float = 30.0, on_demand=None):
        self._load = load
        self.on_demand = on_demand  # on_demand.OnDemand, or None: every configured model loads at once
        if on_demand is not None:
            on_demand.attach(self)
        self._models: dict[str, ModelState] = {}
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=load_threads, thread_name_prefix="load")
        self._unload_timeout_s = unload_timeout_s
        self._changed = threading.Condition(self._lock)
        self.listeners: list[Callable[[str, VersionRecord], None]] = []

    # ---- configuration -------------------------------------------------------------------
    def model_names(self) -> list[str]:
        return [n for n, m in self._models.items() if not m.removed]

    def unknown_model_hint(self, name: str) -> str:
        """For a not-found message: the served names when ``name`` is none of the configured models.

        TF Serving's text stays first (clients match on it); the names after it save the user
        a trip to the config when the model name is mistyped.
        """
        model = self._models.get(name)
        if model is not None and not model.removed:
            return ""
        served = sorted(n for n, m in self._models.items() if not m.removed and m.available[1])
        return f"; served models: {', '.join(served)}" if served else "; no model is served yet"

    def config_of(self, name: str) -> ModelConfig | None:
        model = self._models.get(name)
        return None if model is None or model.removed else model.config

    def set_models(self, configs: list[ModelConfig]) -> None:
        """Replace the set of served models: new ones are added, missing ones unloaded."""
        names = {}
        dupes = {c.name for c in configs if names.setdefault(c.name, c) is not c}  # a set: O(models), not O(models^2)
        if dupes:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"Illegal to list model {sorted(dupes)[0]} multiple times in config list"
            )
        with self._lock:
            for config in configs:
                model = self._models.get(config.name)
                if model is None or model.removed:
                    state = self._models[config.name] = ModelState(config)
                    state.resident = self.on_demand is None
                else:
                    model.config = config
            for name, model in list(self._models.items()):
                if name not in names and not model.removed:
                    self._remove(name, model)
        self.poll()

    def _remove(self, name: str, model: ModelState) -> None:
        """No longer served (under the lock): nothing available at once, its loaded versions unloaded."""
        model.removed = True
        model.available = _NOTHING_AVAILABLE
        for rec in model.records.values():
            if rec.state == AVAILABLE:
                self._start_unload(name, rec)

    def update_models(self, added: list[ModelConfig], removed: list[str]) -> None:
        """Serve ``added`` too (a model served already keeps its state and takes the new config) and stop
        serving ``removed``; the others are not looked at (config_changes.py: one change, not a re-read)."""
        with self._lock:
            for name in removed:
                model = self._models.get(name)
                if model is not None and not model.removed:
                    self._remove(name, model)
            for config in added:
                model = self._models.get(config.name)
                if model is None or model.removed:
                    model = self._models[config.name] = ModelState(config)
                    model.resident = self.on_demand is None
                elif model.config.base_path == config.base_path:
                    continue
                else:
                    model.config = ModelConfig(config.name, config.base_path, model.config.policy, model.config.labels)
        for config in added:
            model = self._models.get(config.name)
            if model is not None and model.resident and not model.removed:  # loaded at once (not on demand)
                self.make_resident(config.name)

    def set_labels(self, name: str, labels: dict[str, int]) -> None:
        with self._lock:
            model = self._models[name]
            model.config = ModelConfig(model.config.name, model.config.base_path, model.config.policy, dict(labels))

    # ---- polling and reconciliation ------------------------------------------------------
    def poll(self) -> None:
        """Look at every model's base path once and start the loads and unloads it calls for."""
        with self._lock:
            models = [(n, m) for n, m in self._models.items() if not m.removed and m.resident]
        for name, model in models:
            on_disk = version_dirs(model.config.base_path, model.config.policy)
            prints = {v: fingerprint(p) for v, p in on_disk.items()}
            with self._lock:
                if model.removed or not model.resident:  # evicted meanwhile (on demand): a reload breaks the budget
                    continue
                self._reconcile(name, model, on_disk, prints)

    def _reconcile(self, name: str, model: ModelState, on_disk: dict[int, Path], prints: dict) -> None:
        aspired = model.config.policy.aspired(set(on_disk))
        for version in sorted(aspired):
            rec = model.records.get(version)
            # An unloaded version aspired again reloads; a failed one only once its files change
            # (e.g. a half-copied directory whose copy has since completed).
            retry = rec is not None and rec.state == END and (
                rec.error is None or prints[version] != rec.fingerprint
            )
            if rec is None or retry:
                rec = VersionRecord(version, on_disk[version])
                rec.fingerprint = prints[version]
                model.records[version] = rec
                self._notify(name, rec)
                self._pool.submit(self._load_version, name, model, rec)
        aspired_available = any(
            model.records[v].state == AVAILABLE for v in aspired if v in model.records
        )
        for version, rec in list(model.records.items()):
            if rec.state == AVAILABLE and version not in aspired and (aspired_available or not aspired):
                self._start_unload(name, rec)

    def _load_version(self, name: str, model: ModelState, rec: VersionRecord) -> None:
        with self._lock:
            rec.state = LOADING
        self._notify(name, rec)
        log.info("Loading servable version {name: %s version: %d} from %s", name, rec.version, rec.path)
        started = time.perf_counter()
        try:
            servable = self._load(name, rec.version, rec.path)
        except ServingError as exc:
            self._fail(name, rec, exc)
        except Exception as exc:  # a broken export must never take the server down
            self._fail(name, rec, ServingError(Code.UNKNOWN, f"{type(exc).__name__}: {exc}"))
        else:
            with self._lock:
                if model.removed:
                    servable.close()
                    self._unloaded(name, rec)
                    rec.state = END
                else:
                    rec.servable = servable
                    rec.state = AVAILABLE
                    self._publish(model)
            log.info(
                "Successfully loaded servable version {name: %s version: %d} (%s runtime, %.2fs)",
                name, rec.version, servable.runtime, time.perf_counter() - started,
            )
            self._notify(name, rec)
            self.poll()  # a newly available version may allow older ones to unload

    def _fail(self, name: str, rec: VersionRecord, error: ServingError) -> None:
        with self._lock:
            rec.error = error
            rec.state = END
        log.error("Failed to load servable version {name: %s version: %d}: %s", name, rec.version, error.message)
        self._notify(name, rec)

    def _start_unload(self, name: str, rec: VersionRecord) -> None:
        rec.state = UNLOADING
        model = self._models[name]
        if not model.removed:
            self._publish(model)
        self._notify(name, rec)
        self._pool.submit(self._unload_version, name, rec)

    def _unload_version(self, name: str, rec: VersionRecord) -> None:
        with rec.idle:
            rec.idle.wait_for(lambda: rec.inflight == 0, timeout=self._unload_timeout_s)
        servable, rec.servable = rec.servable, None
        if servable is not None:
            servable.close()
            self._unloaded(name, rec)
        with self._lock:
            rec.state = END
        log.info("Unloaded servable version {name: %s version: %d}", name, rec.version)
        self._notify(name, rec)

    def _unloaded(self, name: str, rec: VersionRecord) -> None:
        hook = getattr(self._load, "unloaded", None)  # the VersionLoader drops its runtime gauge
        if hook is not None:
            hook(name, rec.version)

    def _publish(self, model: ModelState) -> None:
        available = {v: r for v, r in model.records.items() if r.state == AVAILABLE}
        inline = bool(available) and all(getattr(r.servable, "inline_ok", False) for r in available.values())
        model.available = (max(available) if available else None, available, inline)

    def _notify(self, name: str, rec: VersionRecord) -> None:
        with self._changed:
            self._changed.notify_all()
        for listener in self.listeners:
            listener(name, rec)

    # ---- waiting -------------------------------------------------------------------------
    def settled(self, names: list[str] | None = None) -> bool:
        """True when no load or unload is under way for ``names`` (default: all models)."""
        with self._lock:
            models = self._models.values() if names is None else filter(None, map(self._models.get, names))
            for model in models:
                if any(r.state in (START, LOADING, UNLOADING) for r in model.records.values()):
                    return False
        return True

    def wait_settled(self, names: list[str] | None = None, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self.settled(names):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._changed.wait(timeout=0.2 if remaining is None else min(remaining, 0.2))
        return True

    # ---- request path --------------------------------------------------------------------
    def acquire(self, name: str, version: int | None = None, label: str | None = None, loaded: bool = False) -> Handle:
        """Hold an available version for one request (latest when no version or label is given); on demand,
        a model not loaded is loaded first (``loaded``: that was done, do not load again)."""
        model = self._models.get(name)
        if label is not None:
            labels = model.config.labels if model is not None and not model.removed else {}
            if label not in labels:
                raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
            version = labels[label]
        for _attempt in range(3):
            latest, available, _ = model.available if model is not None else _NOTHING_AVAILABLE
            rec = available.get(latest if version is None else version)
            if rec is None:
                break
            with rec.idle:
                if rec.state == AVAILABLE:
                    rec.inflight += 1
                    if self.on_demand is not None:
                        model.used = time.monotonic()
                        model.requests += 1
                    return Handle(name, rec)
            # Lost a race with an unload; a newer snapshot has been published, so look again.
        if self.on_demand is not None and model is not None and not model.removed and not loaded:
            self.on_demand.ensure(name, model)
            return self.acquire(name, version, label, loaded=True)
        what = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        raise ServingError(Code.NOT_FOUND, f"Servable not found for request: {what}{self.unknown_model_hint(name)}")

    # ---- on demand ---------------------------------------------------------------------------
    def scan(self, name: str) -> dict[int, Path]:
        """The version directories of ``name`` its policy aspires to load (on disk now)."""
        model = self._models.get(name)
        if model is None:
            return {}
        on_disk = version_dirs(model.config.base_path, model.config.policy)
        return {v: on_disk[v] for v in model.config.policy.aspired(set(on_disk))}

    def make_resident(self, name: str) -> None:
        """Start loading ``name`` (on demand), as a poll would for a model loaded at start."""
        model = self._models.get(name)
        if model is None or model.removed:
            return
        on_disk = version_dirs(model.config.base_path, model.config.policy)
        prints = {v: fingerprint(p) for v, p in on_disk.items()}
        with self._lock:
            model.resident = True
            model.used = time.monotonic()
            self._reconcile(name, model, on_disk, prints)

    def evict(self, name: str) -> bool:
        """Unload every version of ``name`` now, if no request holds one and none is loading (False if so).
        The check and the state change happen under each version's lock, so no request can take the
        version in between; requests that come later load it again."""
        with self._lock:
            model = self._models.get(name)
            if model is None or not model.resident:
                return False
            records = list(model.records.values())
            if any(r.state in (START, LOADING) for r in records):
                return False
            for r in records:
                r.idle.acquire()
            try:
                if any(r.inflight for r in records):
                    return False
                unloading = [r for r in records if r.state == AVAILABLE]
                for r in unloading:
                    r.state = UNLOADING
                model.resident = False
                self._publish(model)
            finally:
                for r in records:
                    r.idle.release()
            for r in unloading:
                servable, r.servable = r.servable, None
                if servable is not None:
                    servable.close()
                    self._unloaded(name, r)
                r.state = END
                log.info("Unloaded servable version {name: %s version: %d} (least recently used)", name, r.version)
                self._notify(name, r)
        return True

    def resident_models(self) -> list[tuple[str, float, bool]]:
        """(name, last used, loaded now) of every resident model (on demand)."""
        with self._lock:
            return [(n, m.used, bool(m.available[1])) for n, m in self._models.items() if m.resident and not m.removed]

    def request_counts(self) -> dict[str, int]:
        """Requests each model (that had any) served since it was configured (on demand)."""
        return {n: m.requests for n, m in list(self._models.items()) if m.requests and not m.removed}

    def runs_inline(self, name: str) -> bool:
        """True when every available version of ``name`` answers in microseconds (LiteRT, no batching)."""
        model = self._models.get(name)
        return model is not None and model.available[2]

    def version_states(self, name: str) -> list[VersionRecord]:
        """Every known version of ``name``, newest first (TF Serving's order)."""
        model = self._models.get(name)
        if model is None or model.removed:
            return []
        with self._lock:
            return [model.records[v] for v in sorted(model.records, reverse=True)]

    def is_available(self, name: str, version: int) -> bool:
        model = self._models.get(name)
        return model is not None and version in model.available[1]

    def shutdown(self) -> None:
        with self._lock:
            for name, model in self._models.items():
                model.removed = True
                model.available = _NOTHING_AVAILABLE
                for rec in model.records.values():
                    if rec.servable is not None:
                        rec.servable.close()
                        rec.servable = None
                        rec.state = END
        self._pool.shutdown(wait=False, cancel_futures=True)
