"""Shared parts of the tests of ``modelyard platform --engine ray`` on the session's Ray cluster
(tests/ray_cluster.py): starting a platform on it, asking Ray about the replica actors (through the
session's long-lived driver, ``ask_driver``, so pytest never becomes a Ray driver), finding their ``modelyard serve``
processes (the nodes share this host's pid namespace), and ending every replica actor a test left."""
from __future__ import annotations

import os

from tests.platform.conftest import PlatformProcess, _env, live_processes, start_platform
from tests.ray_cluster import ask_driver

NAMESPACE = "modelyard"
ACTOR_PREFIX = "modelyard-replica-"
REPLICA_DIRS = b"/ray-replicas/"  # a Ray replica's serve command names <node cache>/ray-replicas/<id>/model

# Replica id -> its actor's info() (None: no such actor); no ids: every replica actor of the namespace.
_INFOS_SCRIPT = """
import json, sys, ray
ray.init(address=sys.argv[1], namespace="modelyard", logging_level="ERROR", log_to_driver=False)
ids = sys.argv[2:] or [n[len("modelyard-replica-"):] for n in ray.util.list_named_actors()
                       if n.startswith("modelyard-replica-")]
out = {}
for rid in ids:
    try:
        out[rid] = ray.get(ray.get_actor("modelyard-replica-" + rid).info.remote(), timeout=60)
    except ValueError:
        out[rid] = None  # no such actor
    except Exception as exc:  # ended meanwhile, or not placed yet
        out[rid] = {"error": type(exc).__name__}
print(RESULT + json.dumps(out))
"""

# Ends every replica actor left in the namespace (a failed test must not hold the cluster's CPUs).
_CLEANUP_SCRIPT = """
import json, sys, ray
ray.init(address=sys.argv[1], namespace="modelyard", logging_level="ERROR", log_to_driver=False)
ended = []
for name in ray.util.list_named_actors():
    if name.startswith("modelyard-replica-"):
        try:
            ray.kill(ray.get_actor(name), no_restart=True)
            ended.append(name)
        except ValueError:  # ended meanwhile: go on with the others
            pass
print(RESULT + json.dumps(ended))
"""


def actor_infos(address: str, replica_ids: list[str] | None = None) -> dict:
    """Replica id -> its actor's info (``node_id``, ``pid``, ``model_dir``, ``cached``, ``owner``...), None
    when it has no actor; without ``replica_ids``, every replica actor the namespace holds."""
    return ask_driver(_INFOS_SCRIPT, address, *(replica_ids or []))


def cleanup_actors(address: str) -> None:
    ask_driver(_CLEANUP_SCRIPT, address)


def serve_processes() -> dict[int, str]:
    """pid -> replica id of every running ``modelyard serve`` a Ray replica actor started, on any node."""
    found = {}
    for pid, cmdline, _cwd in live_processes():
        args = cmdline.split(b"\0")
        if REPLICA_DIRS not in cmdline or b"serve" not in args or b"--model_base_path" not in args:
            continue
        base = os.fsdecode(args[args.index(b"--model_base_path") + 1])  # .../ray-replicas/<id>/model
        found[pid] = base.rstrip("/").rsplit("/", 2)[-2]
    return found


def start_ray_platform(tmp_path_factory, name: str, ray_cluster: str, args: list[str]) -> PlatformProcess:
    """A platform whose replicas are actors on the session's Ray cluster; ``cleanup()`` it, then
    ``cleanup_actors`` (its detached actors outlive it). A module needing no flags of its own takes the
    session's, ``ray_platform`` (tests/platform/conftest.py)."""
    return start_platform(tmp_path_factory, name, _env(), ["--engine", "ray", "--ray-address", ray_cluster, *args])


def running(p: PlatformProcess) -> PlatformProcess:
    """``p`` started again if an earlier module's failure left it stopped (a kill -9 test restarts it)."""
    if p.proc is None or p.proc.poll() is not None:
        p.start()
    return p
