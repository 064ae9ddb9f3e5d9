"""Issue 35: a deploy commits its deployed model and its operation's "done" in one store transaction,
so a kill -9 between the two cannot exist, and a restart's (or a new leader's) ``end_pending`` never
aborts a deploy that committed. On the store and operations layer: SQLite here, PostgreSQL in
tests/platform/test_postgres.py (``check_deploy_commits_its_operation`` runs on both)."""
from __future__ import annotations

import asyncio
import time

import pytest

from modelyard.platform.api.errors import ApiError
from modelyard.platform.resources.operations import Operations, current_operation, typed
from modelyard.platform.state.store import Store
from tests.aio import run
from tests.platform.conftest import PARENT


def _endpoint(store: Store, ep_id: str) -> None:
    now = time.time()
    store.add_endpoint({"id": ep_id, "parent": PARENT, "display_name": ep_id, "description": "", "labels": {},
                        "traffic_split": {}, "created": now, "updated": now})


def _dm(dm_id: str, ep_id: str) -> dict:
    return {"id": dm_id, "endpoint_id": ep_id, "model_id": "m", "version_id": "1", "display_name": "m",
            "min_replicas": 1, "max_replicas": 1, "machine_type": "", "created": time.time(), "shadow_percent": 0}


def check_deploy_commits_its_operation(url: str, suffix: str) -> None:
    """The deploy's work through ``Operations.start``, its commit writing the operation's outcome:
    1. committed, then the process dies before anything else runs (the task is never resumed): the
       operation is done with the deploy's response, and the next leader's ``end_pending`` leaves it so;
    2. an operation a new leader ended meanwhile: the deploy commits nothing (no deployed model, no split);
    3. a refused commit (no such endpoint) leaves the operation to end with the commit's error."""
    store = Store(url)
    try:
        ep = "ep" + suffix
        _endpoint(store, ep)
        response = typed("DeployModelResponse", {"deployedModel": {"id": "dm1" + suffix}})

        async def deploy_then_die() -> tuple[dict, str]:
            ops = Operations(store)
            committed = asyncio.Event()
            never = asyncio.Event()

            async def work() -> dict:
                op = current_operation()
                store.add_deployed_model(_dm("dm1" + suffix, ep), {"dm1" + suffix: 100}, operation=(op.id, response))
                op.committed = True
                committed.set()
                await never.wait()  # killed here: the platform's own "done" write never runs
                return response

            rendered = ops.start(PARENT, "endpoints", ep, "DeployModelOperationMetadata", work)
            await asyncio.wait_for(committed.wait(), 10)
            return rendered, rendered["name"].rsplit("/", 1)[-1]

        rendered, op_id = run(deploy_then_die())
        assert rendered["done"] is False
        op = store.get_operation(op_id)
        assert op["done"] == 1 and op["response"] == response and op["error"] is None, op
        assert [d["id"] for d in store.deployed_models(ep)] == ["dm1" + suffix]
        # The next leader (a restart, a follower taking over): nothing of it is pending, nothing aborted.
        assert Operations(store).end_pending() == (0, 0)
        assert Operations.render(store.get_operation(op_id))["response"] == response

        # 2. Ended by a new leader before the commit: ABORTED, and the deploy leaves nothing in the store.
        ops = Operations(store)
        op = Operations._new(PARENT, "endpoints", ep, "DeployModelOperationMetadata")
        store.add_operation(op)
        assert ops.end_pending() == (0, 1)
        with pytest.raises(ApiError) as refused:
            store.add_deployed_model(_dm("dm2" + suffix, ep), {"dm2" + suffix: 100}, operation=(op["id"], response))
        assert refused.value.status == "ABORTED" and "retry" in refused.value.message
        assert [d["id"] for d in store.deployed_models(ep)] == ["dm1" + suffix]
        assert store.get_endpoint(ep)["traffic_split"] == {"dm1" + suffix: 100}
        assert store.get_operation(op["id"])["error"]["code"] == 10

        # 3. A refused commit: the operation is still pending, and ends with the commit's error.
        async def refused_deploy() -> dict:
            ops = Operations(store)

            async def work() -> dict:
                store.add_deployed_model(_dm("dm3" + suffix, "nosuch" + suffix), {},
                                         operation=(current_operation().id, response))
                return response

            rendered = ops.start(PARENT, "endpoints", ep, "DeployModelOperationMetadata", work)
            await ops.wait_all(10)
            return rendered

        op_id = run(refused_deploy())["name"].rsplit("/", 1)[-1]
        op = store.get_operation(op_id)
        assert op["done"] == 1 and op["error"]["code"] == 5 and op["response"] is None, op  # NOT_FOUND
        assert all(d["id"] != "dm3" + suffix for d in store.deployed_models())
    finally:
        store.close()


def test_a_deploy_commits_its_operation_on_sqlite(tmp_path):
    check_deploy_commits_its_operation(f"sqlite:///{tmp_path / 'platform.db'}", "")
