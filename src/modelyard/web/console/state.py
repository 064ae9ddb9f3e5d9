"""What the console shows, read from a running server: its manager and its Prometheus metrics.

Counters are cumulative (as Prometheus exports them); the page turns two samples into a
request rate and a mean latency over the interval, so no history is kept here.
"""
from __future__ import annotations

import time


def _merged(metric, peers: list[dict]) -> dict:
    """This process's values of ``metric`` plus the other workers' (Prometheus' own merge)."""
    values = metric.snapshot()
    for peer in peers:
        metric.merge(values, {tuple(k): v for k, v in peer.get(metric.name, [])})
    return values


def _queue(servable) -> dict | None:
    depth = getattr(servable, "queue_depth", None)
    if depth is None:
        return None
    batches, rows = depth()
    return {"batches": batches, "rows": rows, "max_batches": servable.params.max_enqueued_batches,
            "max_batch_size": servable.params.max_batch_size}


def collect(manager, metrics, peers: list[dict]) -> dict:
    """The console's JSON state: one entry per model, with traffic totals from the metrics."""
    requests = _merged(metrics.request_count, peers)  # (model, status) -> count
    latency = _merged(metrics.request_latency, peers)  # (model, API, entrypoint) -> [buckets..., sum, count]
    models = []
    for name in sorted(manager.model_names()):
        config = manager.config_of(name)
        labels = dict(sorted(config.labels.items())) if config else {}
        by_version: dict[int, list[str]] = {}
        for label, version in labels.items():
            by_version.setdefault(version, []).append(label)
        versions, queue = [], None
        for record in manager.version_states(name):
            servable = record.servable if record.state == "AVAILABLE" else None
            versions.append({
                "version": record.version,
                "state": record.state,
                "error": record.error.message if record.error else "",
                "runtime": getattr(servable, "runtime", None) if servable else None,
                "labels": by_version.get(record.version, []),
            })
            if servable is not None and queue is None:
                queue = _queue(servable)
        counts = {status: n for (model, status), n in requests.items() if model == name}
        rows = [row for (model, _api, _entry), row in latency.items() if model == name]
        models.append({
            "name": name,
            "base_path": str(config.base_path) if config else "",
            "labels": labels,
            "versions": versions,
            "requests": {"total": sum(counts.values()), "ok": counts.get("OK", 0),
                         "by_status": dict(sorted(counts.items()))},
            "latency_us": {"sum": sum(r[-2] for r in rows), "count": sum(r[-1] for r in rows)},
            "queue": queue,
        })
    return {"time": time.time(), "models": models}
