"""Long-running operations (AIP-151): every mutation answers with an Operation.

Quick mutations finish before answering (``done: true``); slow ones (deploy, undeploy) answer
``done: false`` at once and finish in a background task, which the client polls through
``GET .../operations/{id}``. An operation's ``response`` and ``metadata`` carry ``@type`` so the
SDK can unpack them. Operations still pending when the platform stopped are ended at the next
start, since the task that would finish them is gone: failed (ABORTED, retry it), except an undeploy,
which had committed and whose leftover replicas that start stops (``end_pending``).

Every operation ends: an operation whose work fails ends with its error; one whose final write
fails (the store's disk full, the database away) keeps its outcome in memory, and ``reconcile``
(on the platform's timer, every ``RECONCILE_INTERVAL_S``) writes it as soon as the store takes it.

Work that commits at its end (a deploy) writes its operation's outcome in that same transaction
(``current_operation``; ``Store.add_deployed_model(..., operation=...)``): no kill can land between
the commit and the operation's "done", so a restart never aborts a deploy that committed.
"""
from __future__ import annotations

import asyncio
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Awaitable, Callable

from modelyard.platform.api import list_filter, names
from modelyard.platform.api.errors import ApiError
from modelyard.platform.state.store import Store
from modelyard.platform.api.timefmt import rfc3339

log = logging.getLogger(__name__)

TYPE_PREFIX = "type.googleapis.com/google.cloud.aiplatform.v1."
EMPTY = "type.googleapis.com/google.protobuf.Empty"
RECONCILE_INTERVAL_S = 1.0


@dataclass
class Running:
    """The operation whose work runs in this task. ``committed``: the work's own transaction wrote
    the operation's outcome (done, with the work's response), so it is not written again."""
    id: str
    committed: bool = False


_running: ContextVar[Running | None] = ContextVar("modelyard_operation", default=None)


def current_operation() -> Running:
    """The operation whose ``work`` (``Operations.start``) calls this; a RuntimeError outside one."""
    running = _running.get()
    if running is None:
        raise RuntimeError("current_operation() is for an operation's work (Operations.start)")
    return running


def typed(type_name: str, body: dict) -> dict:
    """``body`` with its ``@type`` (a short aiplatform.v1 name, or a full type URL)."""
    url = type_name if "/" in type_name else TYPE_PREFIX + type_name
    return {"@type": url, **body}


def _generic(now: float) -> dict:
    return {"createTime": rfc3339(now), "updateTime": rfc3339(now)}


class Operations:
    """Creates, finishes and renders operations over the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tasks: set[asyncio.Task] = set()
        # Operations whose work ended but whose outcome the store could not take yet: id -> (response, error).
        self._unwritten: dict[str, tuple[dict | None, dict | None]] = {}
        self._running: set[str] = set()  # operations whose work runs in this process

    def _finish(self, op_id: str, response: dict | None, error: dict | None) -> None:
        """Write an operation's outcome; if the store refuses, keep it for ``reconcile``."""
        try:
            self.store.finish_operation(op_id, response, error)
            self._unwritten.pop(op_id, None)
        except Exception as exc:  # disk full, database away: the outcome must not be lost with the task
            if op_id not in self._unwritten:
                log.error("operation %s ended, but the store could not record it (%s); retrying every %.0f s",
                          op_id, exc, RECONCILE_INTERVAL_S)
            self._unwritten[op_id] = (response, error)

    def reconcile(self) -> int:
        """Write the outcomes the store refused before; how many are still unwritten."""
        for op_id, (response, error) in list(self._unwritten.items()):
            self._finish(op_id, response, error)
            if op_id in self._unwritten:
                break  # the store still refuses: try again on the next timer
            log.info("operation %s: its outcome is recorded now", op_id)
        return len(self._unwritten)

    async def run(self) -> None:
        """The timer: outcomes the store refused are written as soon as it takes them."""
        while True:
            await asyncio.sleep(RECONCILE_INTERVAL_S)
            try:
                self.reconcile()
            except Exception:  # the timer must outlive any one failure
                log.exception("reconciling operations failed")

    def end_pending(self) -> tuple[int, int]:
        """When a platform takes the lead (its start, or a follower taking over), once replicas were
        adopted or stopped (``Supervisor.adopt``): end every operation a stopped platform left running
        (not those this process runs itself: a follower's deploy in progress). Returns (finished, aborted).

        An undeploy commits when it is accepted (the deployed model leaves the store and the split at
        once); its operation only had the replicas left to stop, and ``adopt`` has just stopped every
        replica whose model is not deployed. So it ends done, as it would have: ABORTED with "retry
        it" would send the client to a retry that can only be NOT_FOUND (the model is undeployed).
        Every other operation (a deploy commits only at its end: nothing of it is left) ends ABORTED."""
        finished = aborted = 0
        for op in self.store.pending_operations():
            if op["id"] in self._running or op["id"] in self._unwritten:  # ours: it ends, or has ended
                continue
            if str((op["metadata"] or {}).get("@type", "")).endswith(".UndeployModelOperationMetadata"):
                self.store.finish_operation(op["id"], typed("UndeployModelResponse", {}), None)
                finished += 1
            else:
                self.store.finish_operation(op["id"], None, ApiError(
                    "ABORTED", "the platform stopped before this operation finished; retry it").to_rpc_status())
                aborted += 1
        return finished, aborted

    def done(self, parent: str, collection: str | None, resource_id: str | None, metadata_type: str,
             response: dict) -> dict:
        """Record and render an operation that has already finished with ``response``."""
        op = self.new_done(parent, collection, resource_id, metadata_type, response)
        self.store.add_operation(op)
        return self.render(op)

    def new_done(self, parent: str, collection: str | None, resource_id: str | None, metadata_type: str,
                 response: dict) -> dict:
        """The row of a finished operation, not written: for a mutation that writes it in its own
        transaction (``Store.add_endpoint``); ``render`` it once written."""
        op = self._new(parent, collection, resource_id, metadata_type)
        op.update(done=1, response=response)
        return op

    def start(self, parent: str, collection: str | None, resource_id: str | None, metadata_type: str,
              work: Callable[[], Awaitable[dict]]) -> dict:
        """Record a pending operation and run ``work`` (returning the typed response) in the background."""
        op = self._new(parent, collection, resource_id, metadata_type)
        self.store.add_operation(op)
        self._running.add(op["id"])

        async def run() -> None:
            running = Running(op["id"])
            _running.set(running)  # this task's own context: work() and what it awaits see it
            try:
                response = await work()
            except ApiError as exc:
                self._finish(op["id"], None, exc.to_rpc_status())
            except Exception as exc:  # a bug or an I/O failure (the store's disk full): the operation reports it
                log.exception("operation %s failed", op["name"])
                self._finish(op["id"], None, ApiError("INTERNAL", f"{type(exc).__name__}: {exc}").to_rpc_status())
            else:
                if not running.committed:
                    self._finish(op["id"], response, None)
            finally:
                self._running.discard(op["id"])

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return self.render(op)

    async def wait_all(self, timeout: float) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    def get(self, op_id: str) -> dict:
        return self.render(self.store.get_operation(op_id))

    async def list_(self, route: names.Route, query) -> dict:
        """ListOperations: one page of a location's operations (every one under it) or of one resource's,
        filtered (``done``, ``create_time``) and ordered by the store, off the event loop."""
        prefix = (f"{route.parent}/{route.collection}/{route.resource_id}/operations/" if route.resource_id
                  else f"{route.parent}/")
        request = list_filter.list_request(query, list_filter.OPERATION_FIELDS, list_filter.OPERATION_ORDERABLE,
                                           "Operation", prefix)
        rows, token = await asyncio.to_thread(self.store.operations_page, prefix, request)
        out: dict = {"operations": [self.render(r) for r in rows]} if rows else {}
        if token:
            out["nextPageToken"] = token
        return out

    @staticmethod
    def _new(parent: str, collection: str | None, resource_id: str | None, metadata_type: str) -> dict:
        op_id = names.new_id()
        now = time.time()
        return {
            "id": op_id,
            "name": names.operation_name(parent, collection, resource_id, op_id),
            "done": 0,
            "metadata": typed(metadata_type, {"genericMetadata": _generic(now)}),
            "response": None,
            "error": None,
            "created": now,
        }

    @staticmethod
    def render(op: dict) -> dict:
        out = {"name": op["name"], "metadata": op["metadata"], "done": bool(op["done"])}
        if op["error"] is not None:
            out["error"] = op["error"]
        elif op["done"]:
            out["response"] = op["response"]
        return out
