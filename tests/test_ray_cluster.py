"""The shared ``ray_cluster`` fixture: two alive nodes that both run work, a scoped stop, and a second node
that sees none of the head's files (its own mount namespace)."""
from __future__ import annotations


import pytest

from tests.ray_cluster import alive_nodes, ask_driver, session_cluster, start_cluster

# The session's Ray cluster starts in the first test that asks for it: minutes on the busy shared 2-core
# machine (a node whose agents start too slowly is started again), beyond the suite's 600 s per test.
pytestmark = pytest.mark.timeout(1800)

_SPREAD = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
def where():
    import time
    import modelyard  # noqa: F401  (the nodes import this checkout's package)
    time.sleep(3)  # both run at once: one CPU per node puts them on different nodes
    return ray.get_runtime_context().get_node_id()

print(RESULT + json.dumps(sorted(set(ray.get([where.remote() for _ in range(2)])))))
"""


def test_two_alive_nodes_run_tasks(ray_cluster):
    nodes = alive_nodes(ray_cluster, want=2)
    assert len(nodes) == 2, nodes
    assert [n["cpus"] for n in nodes] == [1.0, 1.0]
    ran_on = ask_driver(_SPREAD, ray_cluster, timeout=300)
    assert sorted(ran_on) == sorted(n["id"] for n in nodes), "tasks spread over both nodes"


def test_stop_ends_only_its_own_cluster(ray_cluster):
    """A second, one-node cluster stopped by its process groups: all its processes are gone, and the
    session's cluster (another Ray on this machine) still has both nodes."""
    other = start_cluster(1)
    try:
        assert other.group_pids() and other.stray_pids(), "the cluster's processes are found"
        assert len(alive_nodes(other.address)) == 1
    finally:
        other.stop()
    assert other.group_pids() == [] and other.stray_pids() == []
    assert len(alive_nodes(ray_cluster, want=2)) == 2


_LOOK = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
def look(path):
    import os, time
    time.sleep(3)  # both at once: one per node
    return ray.get_runtime_context().get_node_id(), os.path.exists(path)

print(RESULT + json.dumps(dict(ray.get([look.remote(sys.argv[2]) for _ in range(2)]))))
"""


def test_the_second_node_sees_none_of_the_heads_files(ray_cluster, tmp_path):
    """The head's test files (the pytest base temp dir, /tmp) do not exist on the other node: code that
    assumes a shared disk fails here as on a second machine; the node's own files are its alone."""
    cluster = session_cluster()
    marker = tmp_path / "written-by-the-head"
    marker.write_text("x")
    seen = ask_driver(_LOOK, ray_cluster, str(marker), timeout=300)
    head_id = cluster.node_id(cluster.head)
    assert seen == {head_id: True, next(k for k in seen if k != head_id): False}, seen
    other = cluster.workers()[0]
    root = cluster.node_root(other)
    assert not (root / str(marker).lstrip("/")).exists()
    # Its own temp dir, on its own tmpfs: Ray's session files there, none of the head's (its log, written here).
    own = root / str(cluster.temp_dir).lstrip("/")
    assert list(own.glob("session_*/logs/raylet.out")) and (cluster.temp_dir / "head.log").is_file()
    assert not (own / "head.log").exists()
