"""Cluster specs: which tasks a job has, where they listen, and the TF_CONFIG each one needs.

A cluster spec is TensorFlow's own JSON shape, ``{"chief": ["host:port"], "worker": [...],
"ps": [...]}``. The evaluator is not part of it (TF keeps it outside the cluster so it
never joins collectives); it only gets a ``task`` in its TF_CONFIG. Everything here is
plain Python, so specs are checked before any process or TensorFlow starts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from modelyard.ports import free_ports

ROLES = ("chief", "worker", "ps")
EVALUATOR = "evaluator"


class ClusterError(ValueError):
    """The cluster spec or task name is wrong; the message says how to fix it."""


@dataclass(frozen=True)
class Task:
    """One process of a job: ``worker:1`` is ``Task("worker", 1)``."""

    type: str
    index: int

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


def parse_task(text: str) -> Task:
    """``"worker:1" -> Task("worker", 1)``; raises ClusterError on anything else."""
    kind, sep, index = text.partition(":")
    if not sep or kind not in ROLES + (EVALUATOR,) or not index.isdigit():
        raise ClusterError(
            f"bad task {text!r}: use TYPE:INDEX with TYPE one of {', '.join(ROLES + (EVALUATOR,))}, "
            "e.g. --task worker:1"
        )
    return Task(kind, int(index))


def _check_address(role: str, address: object) -> None:
    if not isinstance(address, str):
        raise ClusterError(f"cluster spec: {role} address {address!r} must be a \"host:port\" string")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"cluster spec: {role} address {address!r} is not \"host:port\" with a port 1-65535")


def validate_spec(spec: object) -> dict[str, list[str]]:
    """Check a cluster spec and return it normalised (known roles only, non-empty lists).

    Rules come from what tf.distribute accepts: at most one chief, at least one worker
    or chief, parameter servers only next to workers, every address unique.
    """
    if not isinstance(spec, dict):
        raise ClusterError('cluster spec must be a JSON object like {"worker": ["host:port", ...]}')
    if "cluster" in spec and isinstance(spec["cluster"], dict):
        spec = spec["cluster"]  # accept a whole TF_CONFIG too
    unknown = sorted(set(spec) - set(ROLES))
    if unknown:
        hint = " (the evaluator is not part of the cluster; use --evaluator)" if EVALUATOR in unknown else ""
        raise ClusterError(f"cluster spec: unknown role(s) {', '.join(unknown)}; roles are {', '.join(ROLES)}{hint}")
    clean: dict[str, list[str]] = {}
    seen: set[str] = set()
    for role in ROLES:
        addresses = spec.get(role) or []
        if not isinstance(addresses, list):
            raise ClusterError(f"cluster spec: {role} must be a list of \"host:port\" strings")
        for address in addresses:
            _check_address(role, address)
            if address in seen:
                raise ClusterError(f"cluster spec: address {address} is used twice; every task needs its own port")
            seen.add(address)
        if addresses:
            clean[role] = list(addresses)
    if len(clean.get("chief", [])) > 1:
        raise ClusterError("cluster spec: at most one chief is allowed")
    if not clean.get("chief") and not clean.get("worker"):
        raise ClusterError("cluster spec: needs at least one chief or worker")
    if clean.get("ps") and not clean.get("worker"):
        raise ClusterError("cluster spec: parameter servers need at least one worker")
    if clean.get("ps") and not clean.get("chief"):
        raise ClusterError("cluster spec: with parameter servers the coordinator runs on the chief; add a chief")
    return clean


def load_spec(path: str | Path) -> dict[str, list[str]]:
    """Read and validate a cluster spec JSON file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterError(f"cluster spec file {path} not found") from None
    except json.JSONDecodeError as exc:
        raise ClusterError(f"cluster spec {path} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    return validate_spec(data)


def local_spec(workers: int, ps: int = 0, chief: bool = False, host: str = "127.0.0.1") -> dict[str, list[str]]:
    """A spec for a job on this machine, one free loopback port per task."""
    if workers < 0 or ps < 0:
        raise ClusterError("--workers and --ps must be zero or more")
    if ps and not chief:
        chief = True  # ParameterServerStrategy needs a coordinator; it runs on the chief
    ports = iter(free_ports(int(chief) + workers + ps, host))
    spec: dict[str, list[str]] = {}
    if chief:
        spec["chief"] = [f"{host}:{next(ports)}"]
    if workers:
        spec["worker"] = [f"{host}:{next(ports)}" for _ in range(workers)]
    if ps:
        spec["ps"] = [f"{host}:{next(ports)}" for _ in range(ps)]
    return validate_spec(spec)


def tasks_of(spec: dict[str, list[str]], evaluator: bool = False) -> list[Task]:
    """Every task of the spec in start order: parameter servers first, so workers find them."""
    order = ("ps", "worker", "chief")
    tasks = [Task(role, i) for role in order for i in range(len(spec.get(role, [])))]
    if evaluator:
        tasks.append(Task(EVALUATOR, 0))
    return tasks


def check_task(spec: dict[str, list[str]], task: Task) -> None:
    """Raise ClusterError unless ``task`` exists in ``spec``."""
    if task.type == EVALUATOR:
        if task.index != 0:
            raise ClusterError("there is only one evaluator: use --task evaluator:0")
        return
    count = len(spec.get(task.type, []))
    if task.index >= count:
        have = f"{count} {task.type} task(s), indices 0..{count - 1}" if count else f"no {task.type} tasks"
        raise ClusterError(f"task {task} is not in the cluster spec, which has {have}")


def tf_config(spec: dict[str, list[str]], task: Task) -> str:
    """The TF_CONFIG JSON string for ``task``."""
    check_task(spec, task)
    return json.dumps({"cluster": spec, "task": {"type": task.type, "index": task.index}})


def replicas_in(spec: dict[str, list[str]], devices_per_worker: int = 1) -> int:
    """How many replicas a collective (multi-worker mirrored) job over ``spec`` has."""
    return (len(spec.get("chief", [])) + len(spec.get("worker", []))) * devices_per_worker
