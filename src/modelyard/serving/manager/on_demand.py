"""Models loaded on demand under a memory budget (``--load_models_on_demand``,
``--model_memory_budget_bytes``), as Triton's explicit model control and KServe ModelMesh do it.

A configured model loads on its first request; requests that arrive while it loads wait on that one
load (the model is marked resident once, under the manager's lock; the others only wait for it to
settle). To make room, the least recently used resident models are unloaded first, and never one a
request holds or one still loading (``Manager.evict`` checks and unloads atomically): when every
resident model is busy, the request waits up to ``ROOM_WAIT_S`` for one to become free, then is
answered RESOURCE_EXHAUSTED. A model's weight is the larger of its files' bytes (``model/footprint.py``)
and the resident memory its latest load added to this process, measured when that load ran alone and paid
no one-time cost (a runtime's first load, a library's import); one whose files alone are larger than the
whole budget is refused at once (the platform refuses it already at deploy).

A request that reaches a model not loaded while on the event loop (the inline and batching paths
look there first) is answered UNAVAILABLE, so the protocol layer hands it to the thread pool, where
loading may block: ``ensure`` never blocks the event loop.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

from modelyard.errors import Code, ServingError
from modelyard.model.footprint import footprint_bytes

LOAD_WAIT_S = 300.0  # a request waits this long for its model's load
ROOM_WAIT_S = 30.0  # ... and this long for a resident model to be free to unload


class _Stats:
    __slots__ = ("loads", "unloads", "load_seconds", "size", "file_bytes", "measured", "changed")

    def __init__(self) -> None:
        self.changed = 0  # OnDemand.seq at its last load, unload or new weight (state(since=...) sends it then)
        self.loads = self.unloads = 0
        self.load_seconds = 0.0
        self.size = 0  # what it weighs against the budget: max(file_bytes, measured)
        self.file_bytes = 0
        self.measured = 0  # the resident memory its latest load alone was measured to add


def resident_memory_bytes() -> int:
    """This process's resident memory (Linux ``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _give_back_freed_memory() -> None:
    """Return freed heap to the system (glibc's malloc_trim), so the next load's growth is its own, not
    hidden in memory an unloaded model left to the allocator."""
    global _trim
    if _trim is None:
        try:
            import ctypes

            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_trim = None


class OnDemand:
    """The on-demand policy of one ``Manager``: what is loaded, when, and what makes room."""

    def __init__(self, budget_bytes: int = 0, measure=resident_memory_bytes) -> None:
        self.budget_bytes = budget_bytes  # 0: no budget (nothing is unloaded to make room)
        self.measure = measure  # the process's resident memory now, in bytes (0: cannot tell)
        self.manager = None
        self._stats: dict[str, _Stats] = {}
        self._room = threading.Lock()  # one request at a time chooses what to unload
        self.seq = 0  # counts changes of any model's stats (a prober asks for those since the seq it last saw)
        self._loading: dict[str, bool] = {}  # models loading now -> another load ran beside it (not measured)
        # Runtimes that loaded a model in this process already: the first load of each also starts its runtime
        # (TensorFlow's kernels, LiteRT's interpreter: tens of MB that stay whatever is unloaded), so it is
        # not measured.
        self._runtimes: set[str] = set()
        self.peak_resident = 0  # most models resident at once, and their bytes
        self.peak_resident_bytes = 0

    def attach(self, manager) -> None:
        self.manager = manager

    def _touch(self, name: str) -> None:
        self.seq += 1
        self._stat(name).changed = self.seq

    def _stat(self, name: str) -> _Stats:
        stats = self._stats.get(name)
        if stats is None:
            stats = self._stats[name] = _Stats()
        return stats

    def resident_bytes(self) -> int:
        return sum(self._stat(n).size for n, _, _ in self.manager.resident_models())

    def ensure(self, name: str, model) -> None:
        """Returns once ``name`` has loaded (or failed to: the caller's acquire then says so)."""
        if asyncio._get_running_loop() is not None:
            raise ServingError(Code.UNAVAILABLE, f"model {name} is not loaded yet; it loads on the thread pool")
        manager = self.manager
        if not model.resident:
            stats = self._stat(name)
            stats.file_bytes = sum(footprint_bytes(p) for p in manager.scan(name).values())
            size = max(stats.file_bytes, stats.measured)
            if self.budget_bytes and stats.file_bytes > self.budget_bytes:
                raise ServingError(Code.RESOURCE_EXHAUSTED, f"model {name} needs {stats.file_bytes} bytes, more "
                                   f"than the whole model memory budget ({self.budget_bytes} bytes)")
            self._load(name, model, size)
        if not manager.wait_settled([name], timeout=LOAD_WAIT_S):
            raise ServingError(Code.UNAVAILABLE, f"model {name} did not load within {LOAD_WAIT_S:.0f} s")
        records = manager.version_states(name)
        if records and not any(r.state == "AVAILABLE" for r in records) and records[0].error is not None:
            raise records[0].error  # the load's own error, rather than "not found"

    def _load(self, name: str, model, size: int) -> None:
        """Make room for ``size`` bytes, then start the load: once, whoever asks meanwhile."""
        manager = self.manager
        deadline = time.monotonic() + ROOM_WAIT_S
        with self._room:
            while not model.resident and not model.removed:
                resident = manager.resident_models()
                used = sum(self._stat(n).size for n, _, _ in resident)
                if not self.budget_bytes or used + size <= self.budget_bytes or not resident:
                    stats = self._stat(name)
                    stats.size, stats.loads = size, stats.loads + 1
                    self._touch(name)
                    started = time.perf_counter()
                    for other in self._loading:
                        self._loading[other] = True
                    self._loading[name] = bool(self._loading)
                    rss_before, modules_before = self.measure(), len(sys.modules)
                    manager.make_resident(name)
                    self.peak_resident = max(self.peak_resident, len(resident) + 1)
                    self.peak_resident_bytes = max(self.peak_resident_bytes, used + size)
                    break
                # Least recently used first; a model still loading or held by a request is skipped by evict.
                for victim, _, _ in sorted(resident, key=lambda r: r[1]):
                    if manager.evict(victim):
                        self._stat(victim).unloads += 1
                        self._touch(victim)
                        _give_back_freed_memory()
                        break
                else:
                    if time.monotonic() > deadline:
                        raise ServingError(Code.RESOURCE_EXHAUSTED, f"no room to load model {name}: every loaded model "
                                           f"has requests in flight (budget {self.budget_bytes} bytes)")
                    time.sleep(0.02)
            else:
                return
        settled = manager.wait_settled([name], timeout=LOAD_WAIT_S)
        with self._room:
            overlapped = self._loading.pop(name, True)
            stats = self._stat(name)
            if settled:
                stats.load_seconds = time.perf_counter() - started
            runtimes = {r.servable.runtime for r in model.available[1].values() if r.servable is not None}
            if settled and runtimes and not overlapped and runtimes <= self._runtimes \
                    and len(sys.modules) == modules_before:  # a library imported meanwhile: a one-time cost
                # What the load cost the process, alone (no other load beside it): the model's weight from now
                # on if more than its files. The latest such load counts (an earlier one may have paid a cost
                # that stays, a cache's fill); a request's own allocations meanwhile only make it heavier.
                stats.measured = max(0, self.measure() - rss_before)
                stats.size = max(stats.file_bytes, stats.measured)
            self._runtimes |= runtimes
            self._touch(name)  # loaded (or failed): its state changed
            if self.budget_bytes:
                self._within_budget(keep=name)

    def _within_budget(self, keep: str) -> None:
        """After a load weighed more than expected: unload least recently used models (not ``keep``, none a
        request holds) until the budget holds again, as far as that is possible without waiting."""
        resident = self.manager.resident_models()
        used = sum(self._stat(n).size for n, _, _ in resident)
        for victim, _, _ in sorted(resident, key=lambda r: r[1]):
            if used <= self.budget_bytes:
                break
            if victim != keep and self.manager.evict(victim):
                self._stat(victim).unloads += 1
                self._touch(victim)
                used -= self._stat(victim).size
                _give_back_freed_memory()

    def state(self, since: int | None = None) -> dict:
        """What the platform's pool probe reads (``GET /v1/models``, or ``GET /v1/on_demand?since=SEQ``): the
        budget, what is resident, and per model its loads, unloads, last load time, requests and how long ago
        it was used. With ``since``, only the models resident now or changed after that ``seq`` (a request
        to a model not resident loads it, so no other model's figures moved): a probe of a pool of a thousand
        models costs what its few active ones do."""
        now = time.monotonic()
        resident = {n: (used, loaded) for n, used, loaded in self.manager.resident_models()}
        requests = self.manager.request_counts()
        models = {}
        seq = self.seq
        if since is None:
            names = self.manager.model_names()
        else:
            names = [*resident, *(n for n, st in list(self._stats.items()) if st.changed > since and n not in resident)]
        for name in names:
            stats = self._stats.get(name)
            if stats is None and name not in resident:
                continue
            stats = stats or _Stats()
            entry = {"loaded": resident.get(name, (0, False))[1], "loads": stats.loads, "unloads": stats.unloads,
                     "load_seconds": round(stats.load_seconds, 6), "bytes": stats.size,
                     "file_bytes": stats.file_bytes, "measured_bytes": stats.measured,
                     "requests": requests.get(name, 0)}
            if name in resident:
                entry["idle_seconds"] = round(now - resident[name][0], 3)
            models[name] = entry
        return {"budget_bytes": self.budget_bytes, "resident_bytes": sum(self._stat(n).size for n in resident),
                "resident_models": len(resident), "peak_resident_models": self.peak_resident,
                "peak_resident_bytes": self.peak_resident_bytes, "models": models, "seq": seq}
