"""Cluster specs and TF_CONFIG: pure Python, no TensorFlow."""
from __future__ import annotations

import json

import pytest

from modelyard.training import cluster


def test_local_spec_and_tf_config():
    spec = cluster.local_spec(workers=2, ps=1)
    assert set(spec) == {"chief", "worker", "ps"}  # ps implies a chief (coordinator)
    addresses = [a for role in spec.values() for a in role]
    assert len(set(addresses)) == len(addresses) and all(a.startswith("127.0.0.1:") for a in addresses)
    tasks = [str(t) for t in cluster.tasks_of(spec, evaluator=True)]
    assert tasks == ["ps:0", "worker:0", "worker:1", "chief:0", "evaluator:0"]
    conf = json.loads(cluster.tf_config(spec, cluster.parse_task("worker:1")))
    assert conf == {"cluster": spec, "task": {"type": "worker", "index": 1}}


@pytest.mark.parametrize("spec, message", [
    ([], "JSON object"),
    ({"workers": ["a:1"]}, "unknown role"),
    ({"evaluator": ["a:1"], "worker": ["a:2"]}, "not part of the cluster"),
    ({"worker": ["localhost"]}, "host:port"),
    ({"worker": ["a:70000"]}, "host:port"),
    ({"worker": ["a:1", "a:1"]}, "used twice"),
    ({"chief": ["a:1", "a:2"]}, "at most one chief"),
    ({"ps": ["a:1"], "chief": ["a:2"]}, "need at least one worker"),
    ({"ps": ["a:1"], "worker": ["a:2"]}, "add a chief"),
    ({}, "at least one chief or worker"),
])
def test_bad_specs_are_named(spec, message):
    with pytest.raises(cluster.ClusterError, match=message):
        cluster.validate_spec(spec)


@pytest.mark.parametrize("text", ["worker", "boss:1", "worker:x", "worker:-1"])
def test_bad_task_names(text):
    with pytest.raises(cluster.ClusterError, match="TYPE:INDEX"):
        cluster.parse_task(text)


def test_task_must_be_in_spec():
    with pytest.raises(cluster.ClusterError, match="indices 0..1"):
        cluster.check_task({"worker": ["a:1", "a:2"]}, cluster.Task("worker", 2))
