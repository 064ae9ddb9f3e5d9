"""The shared ``ray_cluster`` fixture: two alive nodes that both run work, and a scoped stop."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.ray_cluster import alive_nodes, node_env, start_cluster

_SPREAD = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
def where():
    import time
    import modelyard  # noqa: F401  (the nodes import this checkout's package)
    time.sleep(3)  # both run at once: one CPU per node puts them on different nodes
    return ray.get_runtime_context().get_node_id()

print(json.dumps(sorted(set(ray.get([where.remote() for _ in range(2)])))))
"""


def test_two_alive_nodes_run_tasks(ray_cluster):
    nodes = alive_nodes(ray_cluster, want=2)
    assert len(nodes) == 2, nodes
    assert [n["cpus"] for n in nodes] == [1.0, 1.0]
    proc = subprocess.run([sys.executable, "-c", _SPREAD, ray_cluster], env=node_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran_on = json.loads(proc.stdout.strip().splitlines()[-1])
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
